"""DCP's ``.metadata`` read as plain data: no code in a checkpoint ever runs.

``torch.distributed.checkpoint`` stores its metadata as a pickle, and ``pickle.load`` of an
attacker's file runs any callable the file names. Here the file is read by a restricted
unpickler that resolves only the plain-data classes DCP metadata is made of (its metadata
dataclasses, ``torch.Size``, dtypes, the layout and memory-format lookups, ``pathlib``
paths) and refuses every other global, so a planted ``os.system`` is an error, not a call.

What comes out is then checked field by field (types, bounds, chunk coverage, storage
entries naming plain files of the directory, byte ranges inside them) and rebuilt from the
checked primitives into fresh torch objects, so nothing the file constructed is used
afterwards. Any problem is an :class:`~hpcodegen.errors.InputError` (exit 2) naming the
checkpoint; nothing is read from the data files here.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Iterable, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from hpcodegen.errors import InputError, error

METADATA_NAME = ".metadata"
#: Largest ``.metadata`` read (a 70B model on 1,024 ranks writes a few MiB).
MAX_METADATA_BYTES = 256 * 2**20
#: Most chunks one tensor may be saved in (one per shard: far above any real world size).
MAX_CHUNKS = 1 << 16
#: Most chunks of all tensors together, each counted as often as the pickle reaches it (a
#: list shared through the pickle memo costs its length for every key that names it): a
#: 70B model saved with its optimizer state by 1,024 FSDP ranks claims about 2.2M.
MAX_TOTAL_CHUNKS = 1 << 22
#: Most state-dict entries and most storage entries (each) of one checkpoint.
MAX_ITEMS = 1 << 21
#: Bytes a chunk's ``torch.save`` container may hold beyond its tensor data (zip names,
#: headers, the pickle, alignment).
ZIP_SLACK = 1 << 20
#: Most tensor dims (torch's own limit is 64 too).
MAX_DIMS = 64
#: A data file's name: plain, in the directory, not hidden (DCP writes ``__<rank>_<n>.distcp``).
DATA_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")

_MD = "torch.distributed.checkpoint.metadata"
_ALLOWED: dict[tuple[str, str], Any] = {
    (_MD, "Metadata"): Metadata,
    (_MD, "TensorStorageMetadata"): TensorStorageMetadata,
    (_MD, "BytesStorageMetadata"): BytesStorageMetadata,
    (_MD, "ChunkStorageMetadata"): ChunkStorageMetadata,
    (_MD, "TensorProperties"): TensorProperties,
    (_MD, "MetadataIndex"): MetadataIndex,
    (_MD, "StorageMeta"): StorageMeta,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("collections", "OrderedDict"): dict,
}


def _allowed(module: str, name: str) -> Any:
    """The object a pickle may name, or None: the classes above, torch's dtypes, the
    layout and memory-format lookups DCP's properties pickle through, pathlib paths."""
    if (module, name) in _ALLOWED:
        return _ALLOWED[module, name]
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    if (module, name) == ("torch.serialization", "_get_layout"):
        return _layout
    if (module, name) == (_MD, "_MEM_FORMAT_ENCODING"):
        from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

        return _MEM_FORMAT_ENCODING
    if module == "pathlib" and name in ("Path", "PosixPath", "WindowsPath", "PurePath",
                                        "PurePosixPath", "PureWindowsPath"):
        import pathlib

        return pathlib.PurePosixPath if "Windows" not in name else pathlib.PureWindowsPath
    return None


def _layout(name: Any) -> torch.layout:
    """``torch.serialization._get_layout`` for known names only."""
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.layout):
        raise pickle.UnpicklingError(f"unknown layout {name!r}")
    return value


class _PlainData(pickle.Unpickler):
    """An unpickler that builds only the allowlisted plain-data objects."""

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(module, name)
        if found is None:
            raise pickle.UnpicklingError(f"refused to load {module}.{name}: not a plain-data "
                                         "class of DCP metadata")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not plain data")


def _bad(directory: Path, message: str, code: str = "checkpoint.metadata",
         **kw: str) -> InputError:
    return InputError([error(code, str(directory), message,
                             file=str(directory / METADATA_NAME), **kw)])


class OverLimit(ValueError):
    """A metadata file claims more than :data:`MAX_TOTAL_CHUNKS` or :data:`MAX_ITEMS`:
    refused before the work it would cost (``checkpoint.limit``)."""


class _Budget:
    """Work left for one metadata file: chunks as often as they are reached."""

    def __init__(self) -> None:
        self.chunks = MAX_TOTAL_CHUNKS
        #: checked chunk lists by (id of the list the pickle built, tensor size): a list
        #: shared through the pickle memo is checked once, but paid for at every reach
        self.checked: dict[tuple[int, tuple[int, ...]], list[ChunkStorageMetadata]] = {}
        #: checked (offsets, sizes) of each chunk object, the same way (the objects stay
        #: alive in the unpickled value, so their ids are not reused meanwhile)
        self.boxes: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, ...], ...]] = {}
        #: rebuilt chunks of each distinct sequence of chunk objects (lists that differ but
        #: name the same shared objects tile alike: checked once)
        self.covered: dict[tuple[Any, ...], list[ChunkStorageMetadata]] = {}
        #: rebuilt entries by the id of the entry object the pickle built
        self.entries: dict[int, TensorStorageMetadata | BytesStorageMetadata] = {}

    def spend(self, key: str, n: int) -> None:
        self.chunks -= n
        if self.chunks < 0:
            raise OverLimit(f"the tensors claim more than {MAX_TOTAL_CHUNKS} chunks in all "
                            f"(reached at {key[:120]!r}; shared lists count at every use)")


def _regular(path: Path) -> bool:
    import stat

    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def read_metadata(directory: str | Path) -> Metadata:
    """The checkpoint's DCP metadata, read without running code and checked.

    Raises:
        InputError: (exit 2) missing, not a regular file, too large, a pickle naming
            anything but DCP's plain data, or data that does not describe a checkpoint
            of plain files in ``directory`` (every problem is named).
    """
    directory = Path(directory)
    path = directory / METADATA_NAME
    if not _regular(path):
        raise _bad(directory, f"no {METADATA_NAME} regular file: not a complete DCP checkpoint")
    try:
        raw = path.read_bytes() if path.stat().st_size <= MAX_METADATA_BYTES else None
    except OSError as exc:
        raise _bad(directory, f"unreadable: {exc.strerror or exc}") from None
    if raw is None:
        raise _bad(directory, f"larger than {MAX_METADATA_BYTES // 2**20} MiB")
    try:
        value = _PlainData(io.BytesIO(raw)).load()
    except Exception as exc:  # UnpicklingError, EOFError, a __setstate__ refusing its state
        raise _bad(directory, f"not plain DCP metadata: {type(exc).__name__}: "
                              f"{str(exc)[:200]}") from None
    try:
        return _rebuild(value, directory)
    except OverLimit as exc:
        raise _bad(directory, str(exc), "checkpoint.limit",
                   hint="not a checkpoint hpcodegen or torch would write") from None
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
        raise _bad(directory, f"malformed metadata: {str(exc)[:300]}") from None


def _ints(value: Any, what: str, dims: int | None = None) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > MAX_DIMS or not all(
            type(n) is int and 0 <= n < 2**62 for n in value):
        raise ValueError(f"{what} is not a tuple of non-negative integers")
    if dims is not None and len(value) != dims:
        raise ValueError(f"{what} has {len(value)} dims, the tensor {dims}")
    return tuple(value)


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _chunks(key: str, size: tuple[int, ...], chunks: Any,
            budget: _Budget) -> list[ChunkStorageMetadata]:
    if not isinstance(chunks, list) or not chunks or len(chunks) > MAX_CHUNKS:
        raise ValueError(f"{key}: chunks is not a list of 1..{MAX_CHUNKS} chunks")
    budget.spend(key, len(chunks))
    memo = (id(chunks), size)
    if memo in budget.checked:
        return budget.checked[memo]
    # another list of the same shared chunk objects: each was checked, and the sequence
    # found to tile this size, when the first was; one id per chunk, no walk in Python
    same = (size, tuple(map(id, chunks)))
    rebuilt = budget.covered.get(same)
    if rebuilt is not None:
        budget.checked[memo] = rebuilt
        return rebuilt
    boxes = []
    for chunk in chunks:
        if not isinstance(chunk, ChunkStorageMetadata):
            raise TypeError(f"{key}: a chunk is a {type(chunk).__name__}")
        box = budget.boxes.get((id(chunk), size))  # a chunk object the memo shares
        if box is None:
            offsets = _ints(getattr(chunk, "offsets", None), f"{key}: chunk offsets",
                            len(size))
            sizes = _ints(getattr(chunk, "sizes", None), f"{key}: chunk sizes", len(size))
            if any(o + s > n for o, s, n in zip(offsets, sizes, size, strict=True)):
                raise ValueError(f"{key}: chunk at {offsets} of {sizes} leaves the tensor "
                                 f"{size}")
            box = budget.boxes[id(chunk), size] = (offsets, sizes)
        boxes.append(box)
    check_exact_cover(key, size, boxes)
    rebuilt = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s))
               for o, s in boxes]
    budget.covered[same] = budget.checked[memo] = rebuilt
    return rebuilt


def check_exact_cover(key: str, size: tuple[int, ...],
                      boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
    """The chunks tile the tensor: every element in exactly one chunk.

    A gap would leave part of the loaded tensor as whatever memory held; an overlap means
    two different values for one element. Few chunks are compared pairwise; many must form
    a grid (each chunk one cell of the per-dim boundaries), as sharded tensors do: sorting
    and one look-up per chunk and dim, so ``MAX_CHUNKS`` chunks cost milliseconds.
    """
    if sum(_numel(s) for _, s in boxes) != _numel(size):
        raise ValueError(f"{key}: the chunks hold {sum(_numel(s) for _, s in boxes)} "
                         f"elements, the tensor {_numel(size)}")
    boxes = [b for b in boxes if _numel(b[1])]
    if len(boxes) <= 64:
        for i, (o1, s1) in enumerate(boxes):
            for o2, s2 in boxes[i + 1:]:
                if all(a < c + d and c < a + b for a, b, c, d in zip(o1, s1, o2, s2,
                                                                     strict=True)):
                    raise ValueError(f"{key}: chunks at {o1} and {o2} overlap")
        return
    cuts = [sorted({o[d] for o, _ in boxes} | {o[d] + s[d] for o, s in boxes})
            for d in range(len(size))]
    if len(set(boxes)) != len(boxes) or _numel(len(c) - 1 for c in cuts) != len(boxes):
        raise ValueError(f"{key}: {len(boxes)} chunks that do not tile the tensor")
    following = [dict(pairwise(c)) for c in cuts]  # each cut -> the next one
    for offsets, sizes in boxes:
        for d, (o, s) in enumerate(zip(offsets, sizes, strict=True)):
            if following[d].get(o) != o + s:
                raise ValueError(f"{key}: chunk at {offsets} does not tile the tensor")


def _entry(key: str, value: Any,
           budget: _Budget) -> TensorStorageMetadata | BytesStorageMetadata:
    """The checked, rebuilt entry; an entry object the memo shares among keys is checked
    once, its chunks paid for at every key."""
    done = budget.entries.get(id(value))
    if done is not None:
        if isinstance(done, TensorStorageMetadata):
            budget.spend(key, len(done.chunks))
        return done
    budget.entries[id(value)] = done = _new_entry(key, value, budget)
    return done


def _new_entry(key: str, value: Any,
               budget: _Budget) -> TensorStorageMetadata | BytesStorageMetadata:
    if type(value) is BytesStorageMetadata:
        return BytesStorageMetadata()
    if type(value) is not TensorStorageMetadata:
        raise TypeError(f"{key}: a {type(value).__name__}, expected tensor or bytes metadata")
    props = value.properties
    dtype = getattr(props, "dtype", None) if type(props) is TensorProperties else None
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{key}: properties name no dtype")
    size = _ints(value.size, f"{key}: size")
    return TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(size),
                                 _chunks(key, size, value.chunks, budget))


def _storage(index: Any, info: Any, directory: Path,
             sizes: dict[str, int]) -> tuple[MetadataIndex, _StorageInfo]:
    if type(index) is not MetadataIndex or not isinstance(getattr(index, "fqn", None), str):
        raise TypeError("a storage key is not a metadata index")
    offset = index.offset
    offset = None if offset is None else _ints(offset, f"{index.fqn}: storage offset")
    if type(info) is not _StorageInfo:
        raise TypeError(f"{index.fqn}: storage info is a {type(info).__name__}")
    name = getattr(info, "relative_path", None)
    start, length = getattr(info, "offset", None), getattr(info, "length", None)
    if not isinstance(name, str) or not DATA_FILE.match(name) or name == METADATA_NAME:
        raise ValueError(f"{index.fqn}: data file {str(name)[:80]!r} is not a plain file "
                         "name of the checkpoint directory")
    if getattr(info, "transform_descriptors", None):
        raise ValueError(f"{index.fqn}: storage transforms (compression, extensions) are "
                         "not read")
    if name not in sizes:
        path = directory / name
        if not _regular(path):
            raise ValueError(f"{index.fqn}: data file {name} is missing or not a regular file")
        sizes[name] = path.stat().st_size
    if type(start) is not int or type(length) is not int or start < 0 or length <= 0 \
            or start + length > sizes[name]:
        raise ValueError(f"{index.fqn}: bytes {start}+{length} are not inside {name} "
                         f"({sizes[name]} bytes)")
    return (MetadataIndex(index.fqn, offset),
            _StorageInfo(name, start, length, transform_descriptors=None))


def _check_ranges(key: str, md: TensorStorageMetadata | BytesStorageMetadata,
                  storage: Mapping[MetadataIndex, _StorageInfo]) -> None:
    """Each chunk of ``key`` has a storage entry whose byte range can hold it: at least its
    elements' bytes, at most :data:`ZIP_SLACK` more. So a claimed shape (a 2^30-row
    embedding in a few KiB) is refused here, before anything is allocated for it. A plain
    item (the step, JSON text) spans at most twice :data:`ZIP_SLACK`."""
    if isinstance(md, BytesStorageMetadata):
        info = storage.get(MetadataIndex(key))
        if info is None:
            raise KeyError(f"{key}: no storage entry")
        if info.length > 2 * ZIP_SLACK:  # its read holds at most ZIP_SLACK (dcp_safe)
            raise ValueError(f"{key}: a plain item of {info.length} bytes, at most "
                             f"{2 * ZIP_SLACK} expected")
        return
    itemsize = md.properties.dtype.itemsize
    for chunk in md.chunks:
        info = storage.get(MetadataIndex(key, chunk.offsets))
        if info is None:
            raise KeyError(f"{key}: no storage entry for the chunk at {tuple(chunk.offsets)}")
        need = _numel(chunk.sizes) * itemsize
        if not need <= info.length <= need + ZIP_SLACK:
            raise ValueError(f"{key}: the chunk at {tuple(chunk.offsets)} of "
                             f"{tuple(chunk.sizes)} needs {need} bytes, its byte range in "
                             f"{info.relative_path} holds {info.length}")


def _rebuild(value: Any, directory: Path) -> Metadata:
    """Fresh, checked metadata from what the restricted unpickler built."""
    if type(value) is not Metadata:
        raise TypeError(f"the pickle holds a {type(value).__name__}, not DCP metadata")
    entries = value.state_dict_metadata
    raw = value.storage_data
    if not isinstance(entries, dict) or not isinstance(raw, dict):
        raise TypeError("state_dict_metadata or storage_data is not a mapping")
    for what, items in (("state-dict", entries), ("storage", raw)):
        if len(items) > MAX_ITEMS:
            raise OverLimit(f"{len(items)} {what} entries, at most {MAX_ITEMS}")
    if not all(isinstance(k, str) for k in entries):
        raise TypeError("state_dict_metadata is not a mapping of names")
    budget = _Budget()
    state = {key: _entry(key, md, budget) for key, md in entries.items()}

    sizes: dict[str, int] = {}
    storage = dict(_storage(k, v, directory, sizes) for k, v in raw.items())
    ends: dict[str, int] = {}
    for key, md in state.items():
        _check_ranges(key, md, storage)
    for info in storage.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0),
                                       info.offset + info.length)
    for name, end in ends.items():
        if sizes[name] != end:
            raise ValueError(f"data file {name} has {sizes[name]} bytes, its entries end at "
                             f"byte {end}")
    version = value.version if isinstance(value.version, str) else None
    return Metadata(state_dict_metadata=state, planner_data=None, storage_data=storage,
                    storage_meta=StorageMeta(), version=version)


def tensor_problems(metadata: Metadata,
                    expected: Mapping[str, tuple[tuple[int, ...], torch.dtype | None]]
                    ) -> list[str]:
    """What keeps ``metadata`` from holding each ``expected`` key as a tensor of that
    global shape and dtype (None: any floating dtype), one line per key (empty: fits)."""
    problems = []
    entries = metadata.state_dict_metadata
    for key, (shape, dtype) in expected.items():
        md = entries.get(key)
        if md is None:
            problems.append(f"{key}: missing")
        elif not isinstance(md, TensorStorageMetadata):
            problems.append(f"{key}: not a tensor")
        elif tuple(md.size) != tuple(shape):
            problems.append(f"{key}: shape {tuple(md.size)}, expected {tuple(shape)}")
        elif dtype is not None and md.properties.dtype != dtype:
            problems.append(f"{key}: dtype {_name(md.properties.dtype)}, expected "
                            f"{_name(dtype)}")
        elif dtype is None and not md.properties.dtype.is_floating_point:
            problems.append(f"{key}: dtype {_name(md.properties.dtype)}, expected a "
                            "floating-point dtype")
    return problems


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
