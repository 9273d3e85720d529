"""The compiled-model twins of the lowered collectives: closures over constants only.

Dynamo guards every object a compiled function reads, on every call of the compiled model;
``compile_parallelized`` (:mod:`hpcodegen.runtime.compile`) binds each boundary in scope to
these forms, which read the group's name, size and rank and the dim alone. The tensor math
after each collective is the eager ops' own (:mod:`.ops`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol

from hpcodegen.plan.classify import Transition
from hpcodegen.runtime.collectives.autograd import chain, lowered_function
from hpcodegen.runtime.collectives.comm import Comm, as_comm
from hpcodegen.runtime.collectives.local import LocalFn, compiling, map_local_tensors
from hpcodegen.runtime.collectives.ops import chunk_of, place_gathered, step_fn


def traced_step(kind: str, dim: int | None, group: Any) -> LocalFn:
    """:func:`~.ops.step_fn`'s compiled-model form: a functional collective over constants.

    Dynamo guards every object a compiled function reads, on every call of the compiled
    model. Traced, these closures read the group's name, size and rank and the dim (a str
    and ints); the eager partials over a :class:`~.comm.Comm` add about 20 guard nodes per
    transition (the partial, its arguments, the Comm, the group lookup), about 4% of the
    compiled bench forward. The tensor math after the collective is the eager
    functions' own (:func:`~.ops.place_gathered`, :func:`~.ops.chunk_of`). Run eagerly (a
    graph break, ``force_eager``) each is :func:`~.ops.step_fn`'s function, a cell dynamo
    never reads.
    """
    eager = step_fn(kind, dim, group, "")
    name, n, rank = as_comm(group).traced_name()
    if kind == "all_reduce":
        def traced_all_reduce(x: torch.Tensor) -> torch.Tensor:
            if not compiling():
                return eager(x)
            return funcol.all_reduce(x, "sum", name)
        return traced_all_reduce
    assert dim is not None, kind
    if kind == "all_gather":
        def traced_all_gather(x: torch.Tensor) -> torch.Tensor:
            if not compiling():
                return eager(x)
            out = funcol.all_gather_tensor(x.detach().contiguous(), 0, name)
            return place_gathered(x, out, dim, n, rank)
        return traced_all_gather
    if kind == "reduce_scatter":
        def traced_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
            if not compiling():
                return eager(x)
            d = dim % x.dim()
            if x.shape[d] % n:
                return chunk_of(funcol.all_reduce(x, "sum", name), d, n, rank)
            return funcol.reduce_scatter_tensor(x.contiguous(), "sum", d, name)
        return traced_reduce_scatter

    def traced_chunk(x: torch.Tensor) -> torch.Tensor:  # kind "chunk" (step_fn checked)
        return chunk_of(x, dim % x.dim(), n, rank)
    return traced_chunk


def traced_transition(t: Transition, comm: Comm,
                      mismatch: Callable[[Any, int], Any] | None = None) -> Callable[..., Any]:
    """Transition ``t``'s compiled-model form: :func:`traced_lowered` over
    :func:`traced_step`'s closures (the same collectives as the eager ones)."""
    assert t.op is not None  # lowered_fn refused the others
    fwd = None if t.op.kind == "identity" else traced_step(t.op.kind, t.op.dim, comm)
    bwd = chain([traced_step(s.kind, s.dim, comm) for s in t.grad_steps])
    return traced_lowered(fwd, bwd, t.op.dim, mismatch)


def traced_lowered(fwd: LocalFn | None, bwd: LocalFn | None, declared: int | None = None,
                   mismatch: Callable[[Any, int], Any] | None = None) -> Callable[..., Any]:
    """The compiled-model form of a lowered transition (see
    :meth:`~.matching.TPOps.bind_traced`).

    What :func:`~.autograd.apply_lowered` runs under ``torch.compile``: the per-transition
    autograd Function when a gradient can flow, ``fwd`` otherwise. Dynamo guards every
    object it reads, on every call of the compiled model, so each path reads as few cells
    as it can: a no-grad forward reads ``fwd`` alone (``apply`` only when a gradient
    flows), and only a kind that takes a dim gets the ``dim`` parameter. A dim other than
    ``declared`` goes to ``mismatch(value, dim)`` (the eager matching: equal modulo the
    rank, or a PlanError).
    """
    if fwd is None and bwd is None:
        def traced_identity(value: Any) -> Any:
            if type(value) is not torch.Tensor:  # a DTensor (unwrapped), a tuple, None...
                return map_local_tensors(value, traced_identity)
            return value
        return traced_identity
    apply = lowered_function(fwd, bwd).apply

    def traced(value: Any) -> Any:
        if type(value) is not torch.Tensor:
            return map_local_tensors(value, traced)
        if value.requires_grad:
            if torch.is_grad_enabled():
                return apply(value)
            if fwd is None:  # as the Function's view under no_grad: no graph to follow
                return value.detach()
        return fwd(value) if fwd is not None else value

    if declared is None or mismatch is None:
        return traced

    def traced_dim(value: Any, dim: int | None = None) -> Any:
        if dim is not None and dim != declared:
            return mismatch(value, dim)
        return traced(value)
    return traced_dim
