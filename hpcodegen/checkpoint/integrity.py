"""One gate for a checkpoint directory before any of its tensors is read.

:func:`open_checkpoint` reads the record (every field checked), the DCP metadata (plain
data only, checked and rebuilt: :mod:`hpcodegen.checkpoint.metadata`), and refuses a
checkpoint whose parts disagree: a data file the record does not list, a parameter the
record lists that the metadata lacks or holds in another shape or dtype, a model tensor the
record does not list, or a file whose sha256 is not the recorded one. ``export`` and
``resume`` call it (the launcher too, before any rank starts); whatever they load next is
what was checked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch.distributed.checkpoint.metadata import Metadata

from hpcodegen.checkpoint.metadata import METADATA_NAME, read_metadata, tensor_problems
from hpcodegen.checkpoint.record import check_digests, read_record
from hpcodegen.errors import InputError, error

MODEL = "model."

#: ``all``: every file hashed here; ``share``: this rank's share of them (collective: the
#: ranks agree on the result); ``none``: structure only.
Digests = Literal["all", "share", "none"]


@dataclass(frozen=True)
class CheckedCheckpoint:
    """A checkpoint whose record and metadata were read and found consistent."""

    directory: Path
    record: dict[str, Any]
    metadata: Metadata

    @property
    def dtype(self) -> Any:
        import torch

        return getattr(torch, self.record.get("dtype") or "float32")


def _refuse(directory: Path, code: str, message: str, **kw: str) -> InputError:
    return InputError([error(code, str(directory), message, **kw)])


def _more(items: list[str]) -> str:
    return "; ".join(items[:3]) + (f" (+{len(items) - 3} more)" if len(items) > 3 else "")


def open_checkpoint(directory: str | os.PathLike[str], *,
                    digests: Digests = "all") -> CheckedCheckpoint:
    """The checked record and metadata of a checkpoint saved by ``hpcodegen``.

    Raises:
        InputError: (exit 2) anything :func:`read_record` or :func:`read_metadata` refuses,
            or parts that disagree (see the module docstring), each named.
    """
    path = Path(directory)
    record = read_record(path)
    metadata = read_metadata(path)
    files = record["files"]
    used = {METADATA_NAME} | {info.relative_path for info in metadata.storage_data.values()}
    unlisted = sorted(used - set(files))
    if unlisted:
        raise _refuse(path, "checkpoint.unrecorded_file",
                      f"data files the record does not list: {_more(unlisted)}",
                      hint="the checkpoint was changed after it was saved")
    checked = CheckedCheckpoint(path, record, metadata)
    expected = {f"{MODEL}{name}": (tuple(spec["shape"]), checked.dtype)
                for name, spec in record["params"].items()}
    problems = tensor_problems(metadata, expected)
    problems += [f"{key}: not in the record" for key in metadata.state_dict_metadata
                 if key.startswith(MODEL) and key not in expected]
    if problems:
        raise _refuse(path, "checkpoint.params", "the saved tensors are not the ones the "
                      f"record lists: {_more(problems)}")
    _check_sizes(path, files, used)
    if digests != "none":
        _check_files(path, record, digests == "share")
    return checked


def _check_sizes(path: Path, files: dict[str, str], used: set[str]) -> None:
    """Before any byte is hashed: a recorded file nothing reads must be empty (a rank with
    nothing to save), and a data file must not be sparse (DCP writes every byte it lists;
    :func:`~hpcodegen.checkpoint.metadata.read_metadata` already matched each data file's
    size to the byte ranges in it). So hashing costs what the checked metadata claims."""
    idle, sparse = [], []
    for name in sorted(files):
        try:
            info = (path / name).lstat()
        except OSError:
            continue  # missing: check_digests names it
        if name not in used and info.st_size:
            idle.append(f"{name} ({info.st_size} bytes)")
        elif name in used and _is_sparse(info):
            sparse.append(f"{name} ({info.st_size} bytes, {info.st_blocks * 512} on disk)")
    if idle:
        raise _refuse(path, "checkpoint.unused_file",
                      f"recorded files that no saved tensor or item lies in: {_more(idle)}",
                      hint="the checkpoint was changed after it was saved")
    if sparse:
        raise _refuse(path, "checkpoint.sparse_file",
                      f"data files with holes where saved bytes should be: {_more(sparse)}",
                      hint="the checkpoint was not written by a save; use an intact copy")


#: Files below this size are never called sparse (filesystems round small files oddly).
SPARSE_MIN_BYTES = 64 * 2**20


def _is_sparse(info: os.stat_result) -> bool:
    """Fewer than half the file's bytes are on disk (where the OS reports blocks at all;
    a compressing filesystem still stores most of a tensor's bytes)."""
    blocks = getattr(info, "st_blocks", None)
    return bool(blocks is not None and info.st_size >= SPARSE_MIN_BYTES
                and blocks * 512 < info.st_size // 2)


def _check_files(path: Path, record: dict[str, Any], share: bool) -> None:
    names = sorted(record["files"])
    rank, world = _rank_world() if share else (0, 1)
    bad = check_digests(path, record, names[rank::world])
    if share and world > 1:
        import torch.distributed as dist

        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, bad)
        bad = sorted({name for part in gathered for name in (part or [])})
    if bad:
        raise _refuse(path, "checkpoint.corrupted",
                      f"files whose bytes are not the saved ones (sha256 differs, missing or "
                      f"not a regular file): {_more(bad)}",
                      hint="the checkpoint is truncated, corrupted or was edited; use an "
                           "intact copy")


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
