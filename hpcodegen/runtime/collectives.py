"""Lowered tp collectives on local tensors, with DTensor's autograd.

A ``tp_collective`` boundary runs bare collectives on plain local tensors instead of
``DTensor.redistribute``. To stay exact, each one has the backward DTensor would run: the
forward op comes from ``Transition.op`` and the backward from ``Transition.grad_steps``
(``hpcodegen.plan.classify.grad_steps``, the one rule; see docs/design.md "Autograd of
lowered collectives").

Why plain c10d calls: the collectives are the in-place ``torch.distributed`` ops
(``all_reduce``, ``all_gather_single``, ``reduce_scatter_single``) into a result buffer we
allocate, not ``torch.distributed._functional_collectives``. The functional ops cost 26-40 us
per call on a no-op process group (their Python autograd wrapper, the
``AsyncCollectiveTensor`` wrap and the wait) against 3-12 us for the in-place ones, and
both reach the same ``ProcessGroup`` methods, so backend support is the same. ``CommDebugMode``
counts the in-place c10d ops too (``allreduce_``, ``_allgather_base_``,
``_reduce_scatter_base_``), forward and backward alike. The input is never written: an
all_reduce reduces a fresh copy, so tensors that autograd saved or the caller still holds
(a residual, a gradient shared by two branches) keep their values.

Why ``_Lowered`` is skipped when no gradient can flow (``no_grad``, or an input that does
not require grad): ``autograd.Function.apply`` costs a few microseconds per call and would
record nothing.

Measured on torch 2.13: gloo runs ``all_gather_single`` (concatenated output form only, not
the stacked one) and ``reduce_scatter_single``, so no all_reduce + chunk emulation is
needed; a reduce_scatter whose dim does not divide by the group size still falls back to
all_reduce + chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.classify import Step, TPOp, Transition
from hpcodegen.runtime.identity import unwrap_local

LocalFn = Callable[[torch.Tensor], torch.Tensor]

#: torch 2.13 names; older torch has only the (now deprecated) ``*_tensor`` spellings
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def map_local_tensors(value: Any, leaf: LocalFn) -> Any:
    """``leaf`` applied to every local tensor of ``value``: a DTensor is unwrapped to its
    local shard, tuples and lists are walked (nested, type kept), anything else is returned
    as is. The one walker of the lowered ops and the generic engine."""
    value = unwrap_local(value)
    if isinstance(value, (tuple, list)):
        return type(value)(map_local_tensors(v, leaf) for v in value)
    return leaf(value) if isinstance(value, torch.Tensor) else value


def gather(x: torch.Tensor, dim: int, group: Any, world: int | None = None) -> torch.Tensor:
    """all_gather of equal local shards, concatenated on ``dim`` (negative allowed)."""
    n = world or dist.get_world_size(group)
    x = x.contiguous()
    out = x.new_empty((n * x.shape[0], *x.shape[1:]))
    _ALL_GATHER(out, x, group=group)
    d = dim % x.dim()
    return out if d == 0 or n == 1 else torch.cat(out.chunk(n), d)


def reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    """all_reduce(sum) into a fresh tensor (``x`` itself is left as it was)."""
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=group)
    return out


def local_chunk(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """This rank's chunk of ``x`` on ``dim`` (torch.chunk's split, as DTensor's Shard)."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = torch.chunk(x, n, dim % x.dim())
    if rank < len(parts):
        return parts[rank].contiguous()
    shape = list(x.shape)
    shape[dim % x.dim()] = 0
    return x.new_empty(shape)


def scatter(x: torch.Tensor, dim: int, group: Any, world: int | None = None) -> torch.Tensor:
    """reduce_scatter(sum) on ``dim``; all_reduce + chunk when the dim does not divide."""
    n = world or dist.get_world_size(group)
    d = dim % x.dim()
    if x.shape[d] % n:
        return local_chunk(reduce(x, group), d, group)
    # the c10d op scatters dim 0: lay the chunks of ``d`` out one after the other
    src = x.contiguous() if d == 0 else torch.cat(torch.chunk(x, n, d))
    out = src.new_empty((src.shape[0] // n, *src.shape[1:]))
    _REDUCE_SCATTER(out, src, group=group)
    return out


class _World:
    """The group's size, looked up on first use (the group may not exist at install)."""

    __slots__ = ("group", "size")

    def __init__(self, group: Any) -> None:
        self.group, self.size = group, 0

    def __call__(self) -> int:
        if not self.size:
            self.size = dist.get_world_size(self.group)
        return self.size


def step_fn(kind: str, dim: int | None, group: Any, where: str) -> LocalFn:
    """The local function of one collective kind on the tp group."""
    world = _World(group)
    if kind == "all_gather":
        return lambda x: gather(x, dim, group, world())
    if kind == "all_reduce":
        return partial(reduce, group=group)
    if kind == "reduce_scatter":
        return lambda x: scatter(x, dim, group, world())
    if kind == "chunk":
        return lambda x: local_chunk(x, dim, group)
    raise PlanError([error("runtime.unlowerable", where,
                           f"cannot run {kind} as a lowered tp collective")])


def _chain(fns: Sequence[LocalFn]) -> LocalFn | None:
    if not fns:
        return None
    if len(fns) == 1:
        return fns[0]

    def run(x: torch.Tensor) -> torch.Tensor:
        for fn in fns:
            x = fn(x)
        return x
    return run


class _Lowered(torch.autograd.Function):
    """Forward ``fwd`` on the local tensor, backward ``bwd`` on its gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd: LocalFn | None, bwd: LocalFn | None) -> Any:
        ctx.bwd = bwd
        return fwd(x) if fwd is not None else x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return (ctx.bwd(grad) if ctx.bwd is not None else grad), None, None


def lowered_fn(t: Transition, group: Any, where: str) -> Callable[[Any], Any]:
    """The callable executing transition ``t`` on local tensors (nested tuples walked).

    Raises:
        PlanError: ``t`` is not lowerable to one tp collective (it must go generic).
    """
    if t.op is None:
        raise PlanError([error("runtime.unlowerable", where,
                               f"{t.side}put {t.name!r} is not one tp collective")])
    fwd = None if t.op.kind == "identity" else step_fn(t.op.kind, t.op.dim, group, where)
    bwd = _chain([_grad_step(s, group, where) for s in t.grad_steps])
    return apply_lowered(fwd, bwd)


def _grad_step(s: Step, group: Any, where: str) -> LocalFn:
    if s.axis != "tp":
        raise PlanError([error("runtime.unlowerable", where,
                               f"backward step {s} is on axis {s.axis!r}, not tp")])
    return step_fn(s.kind, s.dim, group, where)


def apply_lowered(fwd: LocalFn | None, bwd: LocalFn | None) -> Callable[[Any], Any]:
    """Wrap ``fwd``/``bwd`` as a function over values (tensors, tuples of them, None).

    The autograd Function runs only when a gradient can flow through it (grad mode on and
    a floating input that requires grad); otherwise ``fwd`` runs directly (identity: the
    value itself), which records the same nothing at a fraction of the cost.
    """
    plain = torch.Tensor
    grad_enabled = torch.is_grad_enabled
    apply = _Lowered.apply

    def on_tensor(tensor: torch.Tensor) -> torch.Tensor:
        if fwd is None and bwd is None:
            return tensor
        if tensor.requires_grad:
            if grad_enabled():
                return apply(tensor, fwd, bwd)
            if fwd is None:  # as the Function's view under no_grad: no graph to follow
                return tensor.detach()
        return fwd(tensor) if fwd is not None else tensor

    def run(tensor: Any) -> Any:  # named as TPOps' methods, which may be bound to it
        if type(tensor) is plain:  # the hot path: a local tensor, nothing to walk
            return on_tensor(tensor)
        return map_local_tensors(tensor, on_tensor)
    return run


class TPOps:
    """The ``self._hp_tp`` of one boundary instance: name-free calls, per-transition autograd.

    The generated forward calls ``self._hp_tp.all_gather(x, dim=1)`` without naming ``x``.
    Binding: each call is matched to the boundary's transitions by ``(kind, dim)``; when
    several transitions match (and they may differ in backward, e.g. an input and an output
    all_reduce), the one after the previous call wins, in the generated call order (inputs
    by sorted name, then outputs), wrapping around at the next forward. A call that matches
    no transition is a PlanError: the file and the meta disagree.

    The match depends only on ``(kind, dim, tensor rank, previous call)``, so it is resolved
    once per such key and remembered. When no kind is declared twice (the common case: one
    input ``to_local``, one output ``all_reduce``) the previous call cannot change any match,
    and each declared kind's method is bound on the instance straight to its transition's
    function (a dim that does not match still takes the checked path and its PlanError).
    """

    def __init__(self, fqn: str, transitions: Sequence[Transition], group: Any) -> None:
        self.fqn = fqn
        self._calls: list[tuple[TPOp, Callable[[Any], Any]]] = [
            (t.op, lowered_fn(t, group, fqn))
            for t in transitions
            if t.op is not None and not (t.side == "out" and t.is_identity)
        ]
        self._cursor = 0
        self._bound: dict[tuple[str, int | None, int | None, int], int] = {}
        kinds = [op.kind for op, _ in self._calls]
        if len(set(kinds)) == len(kinds):
            for op, fn in self._calls:
                setattr(self, _METHOD[op.kind], self._direct(op, fn))

    def _direct(self, op: TPOp, fn: Callable[[Any], Any]) -> Callable[..., Any]:
        """The method for ``op.kind`` when only ``op`` can match it: no cursor, no lookup."""
        if op.kind in ("identity", "all_reduce"):
            return fn  # ``run(tensor)``: the method's own signature
        kind, declared = op.kind, op.dim

        def direct(tensor: Any, dim: int | None = None) -> Any:
            if dim is None or declared is None or dim == declared:
                return fn(tensor)
            return self._call(kind, dim, tensor)  # equal modulo the rank, or a PlanError
        return direct

    def to_local(self, tensor: Any) -> Any:
        return self._call("identity", None, tensor)

    def all_gather(self, tensor: Any, dim: int | None = None) -> Any:
        return self._call("all_gather", dim, tensor)

    def all_reduce(self, tensor: Any) -> Any:
        return self._call("all_reduce", None, tensor)

    def reduce_scatter(self, tensor: Any, dim: int | None = None) -> Any:
        return self._call("reduce_scatter", dim, tensor)

    def _call(self, kind: str, dim: int | None, tensor: Any) -> Any:
        ndim = tensor.dim() if isinstance(tensor, torch.Tensor) else None
        key = (kind, dim, ndim, self._cursor)
        index = self._bound.get(key)
        if index is None:
            index = self._bound[key] = self._match(kind, dim, ndim)
        self._cursor = index + 1
        return self._calls[index][1](tensor)

    def _match(self, kind: str, dim: int | None, ndim: int | None) -> int:
        hits = [i for i, (op, _) in enumerate(self._calls)
                if op.kind == kind and _same_dim(op.dim, dim, ndim)]
        if not hits:
            if kind == "identity":
                return self._identity_index()
            raise PlanError([error(
                "runtime.unbound_call", self.fqn,
                f"the generated forward calls {kind}(dim={dim}) but the plan declares no such "
                "transition", expected=", ".join(str(op) for op, _ in self._calls) or "none",
                hint="regenerate the artifact: the modeling file and the meta disagree")])
        after = [i for i in hits if i >= self._cursor]
        return after[0] if after else hits[0]

    def _identity_index(self) -> int:
        """An undeclared ``to_local`` only unwraps: a plain identity with no backward."""
        self._calls.append((TPOp("identity"), apply_lowered(None, None)))
        return len(self._calls) - 1

    def __repr__(self) -> str:
        return f"TPOps({self.fqn}: {', '.join(str(op) for op, _ in self._calls)})"


_METHOD = {"identity": "to_local", "all_gather": "all_gather", "all_reduce": "all_reduce",
           "reduce_scatter": "reduce_scatter"}


def _same_dim(declared: int | None, called: int | None, ndim: int | None) -> bool:
    """Equal dims, also when one counts from the end (``-1`` vs ``2`` on a 3-D tensor)."""
    if declared is None or called is None or declared == called:
        return True
    return ndim is not None and declared % ndim == called % ndim
