"""One atomic file write for every file hpcodegen writes whole (reports, records, traces).

Why: a reader (CI, the launcher watching its ranks, a resume) must see the old file or the
new one, never half of one. Write a temp file in the target's folder, then ``os.replace``;
a failure removes the temp file. The file follows the process umask (``mkstemp`` alone would
make it 0600). Pure: imports neither torch nor transformers.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], render: Callable[[TextIO], Any] | str) -> None:
    """Write ``path`` atomically.

    Args:
        path: the file to create or replace.
        render: the text itself, or a function writing it to the stream it is given.

    Example::

        write_atomic(run_dir / "rank0.json", lambda s: json.dump(record, s))
        write_atomic(report, "all checks passed\\n")

    .. note:: the temp file sits next to ``path`` (``.<name>.*.tmp``) so that the rename stays
       on one filesystem; a folder listing may briefly show it.
    """
    target = Path(path)
    mask = os.umask(0)
    os.umask(mask)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~mask)
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            if isinstance(render, str):
                stream.write(render)
            else:
                render(stream)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
