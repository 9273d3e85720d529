"""Atomic, reproducible writing of an artifact bundle (pure: stdlib only).

A bundle is published all at once or not at all: every file is staged in a sibling temp dir
(``.hpcodegen_tmp_*`` next to the target), the meta is written last with the ``outputs``
hashes of the staged files, then the old bundle is moved aside (``.hpcodegen_old_*``), the
staged one renamed into place and the old one deleted. A failure at any step (or a kill
before the swap) leaves the previous bundle as it was; a failure during the swap moves the
old bundle back. Rendering is separate from writing, so ``--check`` compares the exact bytes
that would be written with what is on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcodegen.artifact.digest import bytes_digest
from hpcodegen.artifact.load import META_NAME

TMP_PREFIX = ".hpcodegen_tmp_"
OLD_PREFIX = ".hpcodegen_old_"


def dump_meta(meta: Mapping[str, Any]) -> bytes:
    """The meta's file bytes: indent 2, sorted keys, ASCII, one trailing newline."""
    return (json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or name == META_NAME:
        raise ValueError(f"bundle file keys must be plain names other than {META_NAME}, "
                         f"got {name!r}")


def render_bundle(files: Mapping[str, bytes], roles: Mapping[str, str],
                  meta: Mapping[str, Any]) -> dict[str, bytes]:
    """Every file of the bundle, meta included, as bytes.

    Args:
        files: file name -> bytes (plain names, the meta excluded).
        roles: file name -> its key in ``meta.outputs`` (``modeling``, ``diff``, ``init``);
            other files are keyed by their name.
        meta: the meta without ``outputs``; a copy gets them.

    Returns:
        ``{name: bytes}`` in sorted name order, ``codegen_meta.json`` included.
    """
    for name in files:
        _check_name(name)
    outputs = {roles.get(name, name): bytes_digest(data) for name, data in files.items()}
    full = dict(meta, outputs=dict(sorted(outputs.items())))
    rendered = {name: files[name] for name in sorted(files)}
    rendered[META_NAME] = dump_meta(full)
    return rendered


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_bundle(target: Path, rendered: Mapping[str, bytes],
                 _after_stage: Callable[[Path], None] | None = None) -> None:
    """Publish ``rendered`` (from :func:`render_bundle`) as the directory ``target``.

    The meta is written last into the staging dir. ``_after_stage`` is a test hook called
    with the staging dir just before the swap (to simulate a failure there).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=target.parent))
    try:
        os.chmod(stage, 0o777 & ~_umask())
        for name in sorted(n for n in rendered if n != META_NAME):
            _write(stage / name, rendered[name])
        _write(stage / META_NAME, rendered[META_NAME])
        if _after_stage is not None:
            _after_stage(stage)
        _swap(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _swap(stage: Path, target: Path) -> None:
    """Move ``target`` aside, rename ``stage`` in, drop the old one (restored on failure)."""
    if not target.exists():
        os.rename(stage, target)
        return
    old = Path(tempfile.mkdtemp(prefix=OLD_PREFIX, dir=target.parent))
    os.rmdir(old)
    os.rename(target, old)
    try:
        os.rename(stage, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def diff_bundle(target: Path, rendered: Mapping[str, bytes]) -> list[str]:
    """Names of files whose bytes on disk differ from ``rendered`` (missing, extra, drifted)."""
    target = Path(target)
    drifted = []
    for name, data in rendered.items():
        path = target / name
        if not path.is_file():
            drifted.append(f"{name}: missing on disk")
        elif path.read_bytes() != data:
            drifted.append(f"{name}: bytes differ from the regenerated bundle")
    if target.is_dir():
        for path in sorted(target.iterdir()):
            if path.name not in rendered and path.name != "__pycache__":
                drifted.append(f"{path.name}: not part of the regenerated bundle")
    return drifted
