"""One planned ``Transition`` as the callable a boundary runs: its forward op, its
backward steps (``Transition.grad_steps``, the one rule), eager with its compiled-model
twin attached as ``.traced``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.classify import Step, TPOp, Transition
from hpcodegen.runtime.collectives.autograd import apply_lowered, chain
from hpcodegen.runtime.collectives.comm import as_comm
from hpcodegen.runtime.collectives.local import LocalFn
from hpcodegen.runtime.collectives.ops import step_fn
from hpcodegen.runtime.collectives.traced import traced_transition


def lowered_fn(t: Transition, group: Any, where: str) -> Callable[[Any], Any]:
    """The callable executing transition ``t`` on local tensors (nested tuples walked).

    Raises:
        PlanError: ``t`` is not lowerable to one tp collective (it must go generic).
    """
    if t.op is None:
        raise PlanError([error("runtime.unlowerable", where,
                               f"{t.side}put {t.name!r} is not one tp collective")])
    comm = as_comm(group)
    for s in t.grad_steps:
        if s.axis != "tp":
            raise PlanError([error("runtime.unlowerable", where,
                                   f"backward step {s} is on axis {s.axis!r}, not tp")])
    fwd = None if t.op.kind == "identity" else step_fn(t.op.kind, t.op.dim, comm, where)
    bwd = chain([step_fn(s.kind, s.dim, comm, where) for s in t.grad_steps])
    run = apply_lowered(fwd, bwd, native=_native(t.op, t.grad_steps, fwd))
    run.traced = functools.partial(traced_transition, t, comm)  # type: ignore[attr-defined]
    return run


def _native(op: TPOp, steps: Sequence[Step], fwd: LocalFn | None) -> LocalFn | None:
    """``fwd`` when its own autograd (C++ ops, see :func:`~.ops.gather` /
    :func:`~.ops.reduce`) is the transition's backward: an all_reduce with no backward step,
    an all_gather whose backward is the chunk on the same dim. None otherwise."""
    if op.kind == "all_reduce" and not steps:
        return fwd
    if op.kind == "all_gather" and len(steps) == 1 and steps[0].kind == "chunk" \
            and steps[0].dim == op.dim and op.dim is not None:
        return fwd
    return None
