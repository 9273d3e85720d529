"""The environment contract between the launcher and each rank.

The launcher never pickles anything to its ranks: everything a rank needs is a string in
its environment, so the same contract serves the built-in smoke job, a user script run
with ``hpcodegen launch ARTIFACT -- train.py`` and a rank started by hand under torchrun.
torchrun itself adds ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``.
"""

from __future__ import annotations

import os

ARTIFACT = "HPCODEGEN_ARTIFACT"
"""The artifact directory (absolute path)."""
MODEL_DIR = "HPCODEGEN_MODEL_DIR"
"""The HF model directory: ``config.json`` and optional ``*.safetensors`` weights."""
RUN_DIR = "HPCODEGEN_RUN_DIR"
"""Where each rank writes ``rank<N>.json`` (its progress, then its result)."""
DEVICE = "HPCODEGEN_DEVICE"
"""Resolved device kind: ``cuda``, ``npu`` or ``cpu`` (``auto`` resolves in the rank)."""
STEPS = "HPCODEGEN_STEPS"
"""Number of AdamW steps of the smoke job (``0``: forward/backward only)."""
CHECK_PARITY = "HPCODEGEN_CHECK_PARITY"
"""``1``: compare logits and gradients with the unsharded model."""
SEED = "HPCODEGEN_SEED"
"""Seed of the model init and the synthetic batch (same on every rank)."""
TOLERANCE = "HPCODEGEN_TOLERANCE"
"""Max abs difference accepted by the parity check."""
DTYPE = "HPCODEGEN_DTYPE"
"""Parameter dtype: ``fp32``, ``bf16`` or ``fp16``."""
SAVE = "HPCODEGEN_SAVE"
"""Save a DCP checkpoint here after the smoke job's steps (empty: no save)."""
RESUME = "HPCODEGEN_RESUME"
"""Resume the smoke job from this checkpoint (empty: start from the weights)."""
MAX_GRAD_NORM = "HPCODEGEN_MAX_GRAD_NORM"
"""Clip gradients by this global norm in the smoke job's steps (empty: no clipping)."""
COMPILE = "HPCODEGEN_COMPILE"
"""``layers`` or ``model``: ``torch.compile`` each decoder layer or the whole model
(:mod:`hpcodegen.launch.compile`); empty: eager."""
COMPILE_BACKEND = "HPCODEGEN_COMPILE_BACKEND"
"""``torch.compile``'s backend with ``HPCODEGEN_COMPILE`` (``launch --compile-backend``);
empty: torch's default, inductor."""
LOSS_PARALLEL = "HPCODEGEN_LOSS_PARALLEL"
"""``1``: the smoke job's loss is vocab-parallel on the sharded logits (set from the
artifact's ``parallel_dims.loss_parallel``; documented for user scripts)."""
FAULT = "HPCODEGEN_FAULT"
"""Fault injection for tests and drills: ``raise:RANK`` or ``hang:RANK``."""
ALLOW_TARGETS = "HPCODEGEN_ALLOW_TARGETS"
"""Comma-separated module prefixes trusted for injection targets (``--allow-target``)."""

#: Every variable above, in the order ``--dry-run`` prints them.
ALL: tuple[str, ...] = (ARTIFACT, MODEL_DIR, RUN_DIR, DEVICE, STEPS, CHECK_PARITY, SEED,
                        TOLERANCE, COMPILE, COMPILE_BACKEND, DTYPE, SAVE, RESUME,
                        MAX_GRAD_NORM, FAULT, ALLOW_TARGETS)


def get(name: str, default: str = "") -> str:
    """An environment value, ``default`` when unset or empty."""
    return os.environ.get(name) or default


def allowed_targets() -> tuple[str, ...]:
    """The ``--allow-target`` prefixes the launcher passed (``HPCODEGEN_ALLOW_TARGETS``)."""
    return tuple(p for p in get(ALLOW_TARGETS).split(",") if p)


def compile_options() -> dict[str, str]:
    """``torch.compile``'s keyword options a launch asked for: ``backend`` when
    ``--compile-backend`` named one (else none: torch's default)."""
    backend = get(COMPILE_BACKEND)
    return {"backend": backend} if backend else {}


def get_int(name: str, default: int) -> int:
    """An integer environment value; a non-integer is a clear error naming the variable."""
    text = get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer") from None
