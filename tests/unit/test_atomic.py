"""hpcodegen.atomic.write_atomic: whole file or the old one, umask followed, no temp left."""

import os
from pathlib import Path

import pytest

from hpcodegen.atomic import write_atomic


def test_text_and_render_replace_whole_and_follow_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    write_atomic(target, "old")
    old = os.umask(0o027)
    try:
        write_atomic(target, lambda s: s.write("new"))
    finally:
        os.umask(old)
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_failing_render_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    write_atomic(target, "old")

    def broken(stream) -> None:
        stream.write("half")
        raise ValueError("render failed")

    with pytest.raises(ValueError, match="render failed"):
        write_atomic(target, broken)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
