"""Loading a ``torch.distributed.checkpoint`` directory as untrusted input.

``dcp.load`` with its default reader and planner unpickles the ``.metadata`` file and every
non-tensor item with code execution (``pickle.load``, ``torch.load(weights_only=False)``),
follows whatever file names the metadata gives, applies the storage transforms it names and
copies a saved chunk into a buffer of any shape that broadcasts. :func:`load` is ``dcp.load``
with a reader and a planner that do none of that:

* the metadata is the checked, rebuilt one of :func:`hpcodegen.checkpoint.metadata.read_metadata`
  (read once, before any collective, and used as is);
* each chunk is read from the plain file and byte range the checked metadata names, after
  its zip header says it holds at most the bytes the chunk needs, stored uncompressed;
  ``torch.load(weights_only=True)`` turns it into a tensor whose dtype must be the one the
  metadata declares and whose slice must have exactly the target's shape;
* non-tensor items (the step, the JSON of the optimizer's groups) load with
  ``weights_only=True`` and must be plain JSON values.

Every failure, DCP's ``CheckpointException`` (a ``BaseException``) included, becomes an
:class:`~hpcodegen.errors.InputError` (exit 2) naming the checkpoint.
"""

from __future__ import annotations

import io
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from hpcodegen.checkpoint.metadata import ZIP_SLACK
from hpcodegen.errors import HpcodegenError, InputError, error


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes of ``raw`` from ``start``."""

    def __init__(self, raw: IO[bytes], start: int, length: int) -> None:
        self._raw, self._start, self._length, self._pos = raw, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._length - self._pos))
        self._raw.seek(self._start + self._pos)
        got = self._raw.readinto(memoryview(buffer)[:n])  # type: ignore[attr-defined]
        self._pos += got or 0
        return got or 0


def _check_container(view: _Window, limit: int, what: str) -> None:
    """The chunk is a zip (``torch.save``'s format) of stored entries of at most ``limit``
    bytes in all: nothing inflates, nothing allocates more than the chunk needs."""
    try:
        with zipfile.ZipFile(view) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ValueError(f"{what}: not a torch.save container ({exc})") from None
    if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
        raise ValueError(f"{what}: compressed entries")
    if sum(i.file_size for i in infos) > limit:
        raise ValueError(f"{what}: holds {sum(i.file_size for i in infos)} bytes, at most "
                         f"{limit} expected")
    view.seek(0)


#: Most values one non-tensor item may hold, each counted as often as it is reached (a list
#: shared through the pickle memo and nested ten deep reaches billions of values).
MAX_PLAIN_VALUES = 1 << 16
#: Deepest nesting of a non-tensor item.
MAX_PLAIN_DEPTH = 32
_SCALARS = (bool, int, float, str)


def plain_problem(value: Any, expected: Any = None) -> str | None:
    """Why ``value`` is not a plain JSON-like value (what our non-tensor items are: the
    step, the optimizer's groups as JSON text), or None.

    The type is checked first: where the item being loaded is a scalar (``expected``: the
    value in the state dict being loaded into), the loaded value must be one of that type
    and nothing is walked. Containers are walked with a budget of
    :data:`MAX_PLAIN_VALUES` values, counted at every reach, and :data:`MAX_PLAIN_DEPTH`.
    """
    if isinstance(expected, _SCALARS):
        want = type(expected)
        if type(value) is want or (want is float and type(value) is int):
            return None
        return f"a {type(value).__name__}, expected {want.__name__}"
    budget = MAX_PLAIN_VALUES
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0:
            return f"more than {MAX_PLAIN_VALUES} values (shared values count at every use)"
        if depth > MAX_PLAIN_DEPTH:
            return f"nested deeper than {MAX_PLAIN_DEPTH}"
        if node is None or isinstance(node, _SCALARS):
            continue
        if isinstance(node, (list, tuple)):
            if len(node) > budget:
                return f"more than {MAX_PLAIN_VALUES} values"
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, dict):
            if len(node) > budget or not all(isinstance(k, str) for k in node):
                return "a mapping with non-string keys or too many values"
            stack.extend((v, depth + 1) for v in node.values())
        else:
            return f"holds a {type(node).__name__}, expected plain values"
    return None


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but non-tensor items load as plain data only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True, map_location="cpu")
        fqn = read_item.dest_index.fqn
        problem = plain_problem(loaded, self.state_dict.get(fqn))
        if problem is not None:
            raise ValueError(f"{fqn}: {problem}")
        if self.flatten_state_dict:  # where DefaultLoadPlanner.load_bytes puts it
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


class SafeReader(FileSystemReader):
    """A ``FileSystemReader`` over checked metadata: plain files, checked chunks."""

    def __init__(self, directory: str | Path, metadata: Metadata) -> None:
        super().__init__(str(directory))
        self._directory = Path(directory)
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # no per-rank metadata files are read
            raise ValueError("per-rank metadata is not read")
        return self._metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if not isinstance(planner, SafeLoadPlanner):
            raise TypeError("SafeReader loads with a SafeLoadPlanner only")
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path,
                                []).append(item)
        for name, items in per_file.items():
            with open(self._directory / name, "rb") as stream:
                for item in items:
                    self._read_one(stream, item, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_one(self, stream: IO[bytes], item: ReadItem, planner: LoadPlanner) -> None:
        info = self.storage_data[item.storage_index]
        view = _Window(stream, info.offset, info.length)
        fqn = item.storage_index.fqn
        md = self._metadata.state_dict_metadata[fqn]
        if item.type == LoadItemType.BYTE_IO:
            _check_container(view, ZIP_SLACK, fqn)
            planner.load_bytes(item, io.BytesIO(view.read()))
            return
        if not isinstance(md, TensorStorageMetadata):
            raise ValueError(f"{fqn}: tensor read of a non-tensor item")
        chunk = next(c for c in md.chunks if tuple(c.offsets) == tuple(item.storage_index.offset))
        itemsize = torch.empty((), dtype=md.properties.dtype).element_size()
        _check_container(view, _numel(chunk.sizes) * itemsize + ZIP_SLACK, fqn)
        tensor = torch.load(view, map_location="cpu", weights_only=True)
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(chunk.sizes) \
                or tensor.dtype != md.properties.dtype:
            got = (f"{tuple(tensor.shape)} {tensor.dtype}" if isinstance(tensor, torch.Tensor)
                   else type(tensor).__name__)
            raise ValueError(f"{fqn}: the chunk at {tuple(chunk.offsets)} holds {got}, the "
                             f"metadata says {tuple(chunk.sizes)} {md.properties.dtype}")
        for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths,
                                                  strict=True)):
            tensor = tensor.narrow(dim, start, length)
        target = planner.resolve_tensor(item).detach()
        if target.shape != tensor.shape:
            raise ValueError(f"{fqn}: a slice of {tuple(tensor.shape)} for a target of "
                             f"{tuple(target.shape)}")
        target.copy_(tensor)
        planner.commit_tensor(item, target)


def _numel(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _inner(exc: BaseException) -> BaseException:
    """The first rank's own error inside DCP's ``CheckpointException`` (whose failures
    map a rank to ``(exception, traceback)``), else ``exc`` itself."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, Mapping) and failures:
        first = failures[min(failures)]
        inner = first[0] if isinstance(first, tuple) and first else first
        if isinstance(inner, BaseException):
            return inner
    return exc


def guarded_load(directory: str | Path, what: str, call: Callable[[], Any]) -> Any:
    """Run a DCP call; any failure of it (``CheckpointException`` too) is an InputError."""
    try:
        return call()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        inner = _inner(exc)
        if isinstance(inner, HpcodegenError):
            raise inner from None
        text = " ".join(f"{type(inner).__name__}: {inner}".split())[:400]
        raise InputError([error("checkpoint.unreadable", str(directory),
                                f"the checkpoint cannot be {what}: {text}",
                                hint="the checkpoint is truncated, corrupted or was not "
                                     "written by `hpcodegen launch --save`")]) from None


def load(state: dict[str, Any], directory: str | Path, metadata: Metadata, *,
         no_dist: bool = False) -> None:
    """``dcp.load(state)`` from ``directory`` through the safe reader and planner (in place).

    ``metadata`` comes from :func:`hpcodegen.checkpoint.metadata.read_metadata`; callers
    check it against what they load first (:func:`~hpcodegen.checkpoint.metadata.tensor_problems`).
    """
    import torch.distributed.checkpoint as dcp

    def call() -> None:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=SafeReader(directory, metadata),
                     planner=SafeLoadPlanner(), no_dist=no_dist)

    guarded_load(directory, "read", call)


def load_untrusted(state_dict: dict[str, Any], checkpoint_id: str | Path) -> None:
    """``dcp.load(state_dict, checkpoint_id=...)`` for a DCP checkpoint you do not trust
    (any DCP checkpoint, with or without an hpcodegen record), in place and collective.

    Its metadata is read as plain data (:func:`~hpcodegen.checkpoint.metadata.read_metadata`),
    every tensor of ``state_dict`` (nested dicts flattened as DCP flattens them) must be in
    it with its global shape (a floating tensor may convert between floating dtypes, any
    other needs its own dtype), and the chunks and plain items load through the checking
    reader and planner.

    Example::

        state = {"model": model.state_dict()}
        hpcodegen.checkpoint.load_untrusted(state, "downloaded/ckpt")
        model.load_state_dict(state["model"])

    Raises:
        InputError: (exit 2) the checkpoint is not plain DCP data or does not fit.
    """
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    from hpcodegen.checkpoint.metadata import read_metadata, tensor_problems

    directory = Path(checkpoint_id)
    metadata = read_metadata(directory)
    flat, _ = flatten_state_dict(state_dict)
    expected = {key: (tuple(value.shape), None if value.is_floating_point() else value.dtype)
                for key, value in flat.items() if isinstance(value, torch.Tensor)}
    problems = tensor_problems(metadata, expected)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise InputError([error("checkpoint.params", str(directory),
                                "the checkpoint does not hold what is loaded: "
                                + "; ".join(problems[:3]) + more)])
    load(state_dict, directory, metadata)
