"""The recorded ``source.line_count`` is counted like ``outputs.*.lines`` (over the bytes)."""

from __future__ import annotations

from hpcodegen.artifact.digest import bytes_digest
from hpcodegen.generate.emit.source import ModelingSource


def test_line_count_is_the_digest_count() -> None:
    # str.splitlines would count 6 lines here: the form feed and U+2028 split it too
    text = "import os\n\x0c\nclass A:  # a\u2028b\n    pass\n"
    src = ModelingSource("transformers.x", "transformers/x.py", text, "0")
    data = text.encode("utf-8")
    assert src.line_count == bytes_digest(data)["lines"] == 4
    assert src.sha256 == bytes_digest(data)["sha256"]
