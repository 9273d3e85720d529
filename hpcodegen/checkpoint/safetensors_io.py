"""Read slices of an HF safetensors checkpoint without reading the rest of it.

A checkpoint is one ``model.safetensors``, several ``*.safetensors`` files, or shards
listed in ``model.safetensors.index.json`` (``weight_map``: tensor name -> file). Only the
headers are read up front. :meth:`SafetensorsCheckpoint.read` then opens the file that
holds one tensor, takes ``safe_open(...).get_slice(name)[index]`` (a view of the file's
memory map) and copies it into a fresh tensor of the wanted dtype and device.

.. note:: pages of a memory-mapped file that a rank touches count in its resident memory
   until the map is closed, and a column slice touches every page of its rows. Reads
   therefore go in blocks of rows, each through its own ``safe_open``: a rank holds at
   most one block of file pages (``CHUNK_BYTES``) at a time, so its peak host memory is
   its shards plus a few MiB, whatever the largest tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hpcodegen.checkpoint.weight_files import INDEX_NAME, weight_files
from hpcodegen.errors import PlanError, error

__all__ = ["CHUNK_BYTES", "INDEX_NAME", "SafetensorsCheckpoint", "TensorInfo"]
#: Largest block of a file one read maps at a time (see :meth:`SafetensorsCheckpoint.read`).
CHUNK_BYTES = 8 * 2**20


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    shape: tuple[int, ...]
    dtype: torch.dtype


def _unreadable(file: Path, exc: BaseException) -> PlanError:
    return PlanError([error("launch.weights_unreadable", "", "not a readable safetensors "
                            f"file: {type(exc).__name__}: {exc}", file=str(file))])


class SafetensorsCheckpoint:
    """The tensors of one safetensors checkpoint directory, by name (headers only)."""

    def __init__(self, directory: str | Path) -> None:
        from safetensors import safe_open

        self.directory = Path(directory)
        self.files = weight_files(self.directory)
        self.tensors: dict[str, TensorInfo] = {}
        for file in self.files:
            try:
                with safe_open(str(file), framework="pt") as handle:
                    for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                        view = handle.get_slice(name)
                        if view.get_dtype() not in _DTYPES:
                            raise ValueError(f"tensor {name!r} has dtype {view.get_dtype()}, "
                                             f"expected one of {', '.join(_DTYPES)}")
                        info = TensorInfo(file, tuple(view.get_shape()),
                                          _DTYPES[view.get_dtype()])
                        if name in self.tensors:
                            raise PlanError([error(
                                "launch.weights_duplicate", name,
                                f"in both {self.tensors[name].file.name} and {file.name}",
                                file=str(file))])
                        self.tensors[name] = info
            except PlanError:
                raise
            except Exception as exc:  # safetensors raises its own error types on a bad header
                raise _unreadable(file, exc) from None

    def __bool__(self) -> bool:
        return bool(self.files)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def total_bytes(self) -> int:
        """Bytes of tensor data (what "the checkpoint's size" means in the benchmark)."""
        return sum(t.dtype.itemsize * _numel(t.shape) for t in self.tensors.values())

    def read(self, name: str, index: tuple[slice, ...] | None = None, *,
             dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        """A copy of ``tensor[name][index]`` as ``dtype`` on ``device``.

        Read in blocks of rows (dim 0) of at most ``CHUNK_BYTES`` of the file, each through
        its own ``safe_open``: the file's touched pages leave this process's resident memory
        after every block, so the transient cost is one block, not one tensor (a column
        slice touches whole rows).
        """
        from safetensors import safe_open

        info = self.tensors[name]
        index = index or tuple(slice(0, n) for n in info.shape)
        out = torch.empty(tuple(s.stop - s.start for s in index), dtype=dtype or info.dtype,
                          device=device)
        try:
            if not info.shape:
                with safe_open(str(info.file), framework="pt") as handle:
                    out.copy_(handle.get_tensor(name))
                return out
            row_bytes = info.dtype.itemsize * _numel(info.shape[1:])
            rows = max(1, CHUNK_BYTES // max(row_bytes, 1))
            first, last = index[0].start, index[0].stop
            for start in range(first, last, rows):
                stop = min(start + rows, last)
                with safe_open(str(info.file), framework="pt") as handle:
                    part = handle.get_slice(name)[(slice(start, stop), *index[1:])]
                    out[start - first:stop - first].copy_(part)
                    del part
        except Exception as exc:
            raise _unreadable(info.file, exc) from None
        return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
