"""Which files of a model directory hold its safetensors weights (pure: no torch).

The files listed in ``model.safetensors.index.json`` (``weight_map``: tensor -> file), else
every ``*.safetensors`` of the directory. A weights directory is untrusted input: each
file must be a plain name in the directory and, links followed (the HF cache links its
snapshots to blobs), a regular file. A FIFO, a device or a directory named
``*.safetensors`` would block or fail every rank that opens it; it is refused here, by
``stat`` alone, before anything opens it (the launcher calls this before any rank starts).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from hpcodegen.errors import PlanError, error

INDEX_NAME = "model.safetensors.index.json"
#: Largest index read (a weight map names every tensor once: a few MiB at most).
MAX_INDEX_BYTES = 64 * 2**20


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _special(path: Path) -> bool:
    """Exists (links followed) but is not a regular file: a FIFO, a device, a directory."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _index_names(index: Path) -> list[str]:
    try:
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise ValueError(f"larger than {MAX_INDEX_BYTES // 2**20} MiB")
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = list(dict.fromkeys(weight_map.values()))
        if not all(isinstance(n, str) for n in names):
            raise TypeError("file names must be strings")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise PlanError([error("launch.weights_index", "/weight_map",
                               f"unreadable index: {type(exc).__name__}: {exc}",
                               expected='{"weight_map": {tensor name: file name}}',
                               file=str(index))]) from None
    return names


def weight_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files to read (sorted by the index's order, else by name).

    Raises:
        PlanError: an index that cannot be read or names a file outside the directory,
            or a weights file (named by the index or ``*.safetensors``) that is not a
            regular file.
    """
    directory = Path(directory)
    index = directory / INDEX_NAME
    if _special(index):
        raise _not_regular(index)
    if _is_regular(index):
        files = []
        for name in _index_names(index):
            path = directory / name
            if Path(name).name != name or name in ("", ".", "..") or not path.exists():
                raise PlanError([error("launch.weights_index", f"/weight_map ({name})",
                                       "names a file that is not in the checkpoint directory",
                                       file=str(index))])
            files.append(path)
    else:
        try:
            files = sorted(directory.glob("*.safetensors"))
        except OSError:
            files = []
    for path in files:
        if not _is_regular(path):
            raise _not_regular(path)
    return files


def _not_regular(path: Path) -> PlanError:
    return PlanError([error("launch.weights_unreadable", "",
                            "not a regular file (a FIFO, a device or a directory): refused "
                            "before any rank opens it", file=str(path),
                            hint="weights are plain safetensors files (links to them are "
                                 "fine)")])
