"""Which accelerator a rank runs on and which collective backend goes with it.

``cuda`` -> ``nccl``, ``npu`` -> ``hccl`` (Ascend, through the ``torch_npu`` plugin), ``cpu``
-> ``gloo``; ``auto`` picks the first available in that order. The launcher resolves the
kind once (so ``--device cuda`` on a machine without CUDA is a usage error before any rank
starts) and each rank binds ``LOCAL_RANK`` to its device.

.. note:: ``torch_npu`` must be imported before ``torch.npu`` exists; importing it is what
   registers the ``npu`` device type and the ``hccl`` backend with torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from hpcodegen.errors import UsageError, error

DEVICE_KINDS: tuple[str, ...] = ("auto", "cuda", "npu", "cpu")
BACKENDS: dict[str, str] = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}
#: What restricts the devices a node's ranks see, per kind (documented for users).
VISIBLE_DEVICES_VAR: dict[str, str] = {"cuda": "CUDA_VISIBLE_DEVICES",
                                       "npu": "ASCEND_RT_VISIBLE_DEVICES"}


@dataclass(frozen=True)
class DeviceChoice:
    """A resolved device kind, its process-group backend, and why ``auto`` passed over an
    accelerator (None when it did not)."""

    kind: str
    backend: str
    note: str | None = None


def _npu_module() -> Any | None:
    """``torch.npu`` after importing the ``torch_npu`` plugin, or None when absent."""
    try:
        importlib.import_module("torch_npu")
    except ImportError:
        return None
    import torch

    return getattr(torch, "npu", None)


def _available(kind: str) -> tuple[bool, int]:
    """Whether ``kind`` is usable here, and how many devices it has."""
    if kind == "cpu":
        return True, 0
    if kind == "cuda":
        import torch

        ok = bool(torch.cuda.is_available())
        return ok, int(torch.cuda.device_count()) if ok else 0
    npu = _npu_module()
    if npu is None or not npu.is_available():
        return False, 0
    return True, int(npu.device_count())


def resolve_device(requested: str, nproc: int | None = None) -> DeviceChoice:
    """Resolve ``--device`` to a kind and backend.

    Args:
        requested: ``auto``, ``cuda``, ``npu`` or ``cpu``.
        nproc: ranks per node; more ranks than devices is refused for an explicit kind and
            passed over by ``auto`` (None: not checked).

    Returns:
        The device kind and its backend (``nccl``, ``hccl``, ``gloo``).

    Raises:
        UsageError: an unknown kind, an unavailable device, or too few devices.

    Example::

        >>> resolve_device("cpu")
        DeviceChoice(kind='cpu', backend='gloo')
    """
    if requested not in DEVICE_KINDS:
        raise UsageError([error("launch.device", "--device", f"unknown device {requested!r}",
                                expected=" | ".join(DEVICE_KINDS))])
    candidates = ("cuda", "npu", "cpu") if requested == "auto" else (requested,)
    skipped: list[str] = []
    for kind in candidates:
        ok, count = _available(kind)
        if not ok:
            continue
        if kind != "cpu" and nproc is not None and count < nproc:
            if requested == "auto":  # auto: a device kind that can hold every rank
                skipped.append(f"{count} {kind} device(s) for {nproc} ranks")
                continue
            raise UsageError([error(
                "launch.device_count", "--nproc",
                f"{nproc} ranks per node but only {count} {kind} device(s) visible",
                expected=f"--nproc <= {count}",
                hint=f"check {VISIBLE_DEVICES_VAR[kind]}")])
        note = f"--device auto chose {kind}: only {', '.join(skipped)}" if skipped else None
        return DeviceChoice(kind, BACKENDS[kind], note)
    hint = "install torch_npu (Ascend)" if requested == "npu" else "use --device cpu"
    raise UsageError([error("launch.device", "--device",
                            f"--device {requested}: no {requested} device is available",
                            hint=hint)])


def bind_device(kind: str, local_rank: int) -> Any:
    """Make ``local_rank``'s device current and return it as a ``torch.device``.

    For ``npu`` this imports ``torch_npu`` and calls ``torch.npu.set_device(local_rank)``.
    """
    import torch

    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if kind == "npu":
        npu = _npu_module()
        if npu is None:
            raise RuntimeError("device npu requested but torch_npu cannot be imported")
        npu.set_device(local_rank)
        return torch.device("npu", local_rank)
    return torch.device("cpu")
