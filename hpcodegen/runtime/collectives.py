"""Lowered tp collectives on local tensors, with DTensor's autograd.

A ``tp_collective`` boundary runs bare collectives on plain local tensors instead of
``DTensor.redistribute``. To stay exact, each one has the backward DTensor would run: the
forward op comes from ``Transition.op`` and the backward from ``Transition.grad_steps``
(``hpcodegen.plan.classify.grad_steps``, the one rule; see docs/design.md "Autograd of
lowered collectives"). The collectives are ``torch.distributed._functional_collectives``
ops, so ``CommDebugMode`` counts them (forward and backward alike).

Measured on torch 2.13: gloo runs ``all_gather_into_tensor`` and ``reduce_scatter_tensor``
through the functional ops, so no all_reduce + chunk emulation is needed; a reduce_scatter
whose dim does not divide by the group size still falls back to all_reduce + chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.classify import Step, TPOp, Transition

LocalFn = Callable[[torch.Tensor], torch.Tensor]


def _wait(t: torch.Tensor) -> torch.Tensor:
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def _unwrap(value: Any) -> Any:
    """A DTensor's local shard; anything else unchanged."""
    to_local = getattr(value, "to_local", None)
    return to_local() if callable(to_local) and hasattr(value, "placements") else value


def gather(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """all_gather of equal local shards, concatenated on ``dim`` (negative allowed)."""
    fn = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    return _wait(fn(x.contiguous(), dim % x.dim(), group))


def reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    """all_reduce(sum)."""
    return _wait(funcol.all_reduce(x.contiguous(), "sum", group))


def local_chunk(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """This rank's chunk of ``x`` on ``dim`` (torch.chunk's split, as DTensor's Shard)."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = torch.chunk(x, n, dim % x.dim())
    if rank < len(parts):
        return parts[rank].contiguous()
    shape = list(x.shape)
    shape[dim % x.dim()] = 0
    return x.new_empty(shape)


def scatter(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """reduce_scatter(sum) on ``dim``; all_reduce + chunk when the dim does not divide."""
    d = dim % x.dim()
    if x.shape[d] % dist.get_world_size(group):
        return local_chunk(reduce(x, group), d, group)
    fn = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
    return _wait(fn(x.contiguous(), "sum", d, group))


def step_fn(kind: str, dim: int | None, group: Any, where: str) -> LocalFn:
    """The local function of one collective kind on the tp group."""
    if kind == "all_gather":
        return lambda x: gather(x, dim, group)
    if kind == "all_reduce":
        return lambda x: reduce(x, group)
    if kind == "reduce_scatter":
        return lambda x: scatter(x, dim, group)
    if kind == "chunk":
        return lambda x: local_chunk(x, dim, group)
    raise PlanError([error("runtime.unlowerable", where,
                           f"cannot run {kind} as a lowered tp collective")])


def _chain(fns: Sequence[LocalFn]) -> LocalFn | None:
    if not fns:
        return None

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
    """Wrap ``fwd``/``bwd`` as a function over values (tensors, tuples of them, None)."""

    def run(value: Any) -> Any:
        value = _unwrap(value)
        if isinstance(value, (tuple, list)):
            return type(value)(run(v) for v in value)
        if not isinstance(value, torch.Tensor):
            return value
        if fwd is None and (bwd is None or not value.requires_grad):
            return value
        if not value.is_floating_point() and not value.is_complex():
            return fwd(value) if fwd is not None else value
        return _Lowered.apply(value, fwd, bwd)
    return run


class TPOps:
    """The ``self._hp_tp`` of one boundary instance: name-free calls, per-transition autograd.

    The generated forward calls ``self._hp_tp.all_gather(x, dim=1)`` without naming ``x``.
    Binding: each call is matched to the boundary's transitions by ``(kind, dim)``; when
    several transitions match (and they may differ in backward, e.g. an input and an output
    all_reduce), the one after the previous call wins, in the generated call order (inputs
    by sorted name, then outputs), wrapping around at the next forward. A call that matches
    no transition is a PlanError: the file and the meta disagree.
    """

    def __init__(self, fqn: str, transitions: Sequence[Transition], group: Any) -> None:
        self.fqn = fqn
        self._calls: list[tuple[TPOp, Callable[[Any], Any]]] = [
            (t.op, lowered_fn(t, group, fqn))
            for t in transitions
            if t.op is not None and not (t.side == "out" and t.is_identity)
        ]
        self._cursor = 0

    def to_local(self, tensor: Any) -> Any:
        return self._call("identity", None, tensor)

    def all_gather(self, tensor: Any, dim: int | None = None) -> Any:
        return self._call("all_gather", dim, tensor)

    def all_reduce(self, tensor: Any) -> Any:
        return self._call("all_reduce", None, tensor)

    def reduce_scatter(self, tensor: Any, dim: int | None = None) -> Any:
        return self._call("reduce_scatter", dim, tensor)

    def _call(self, kind: str, dim: int | None, tensor: Any) -> Any:
        index = self._match(kind, dim, tensor)
        self._cursor = index + 1
        return self._calls[index][1](tensor)

    def _match(self, kind: str, dim: int | None, tensor: Any) -> int:
        ndim = tensor.dim() if isinstance(tensor, torch.Tensor) else None
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


def _same_dim(declared: int | None, called: int | None, ndim: int | None) -> bool:
    """Equal dims, also when one counts from the end (``-1`` vs ``2`` on a 3-D tensor)."""
    if declared is None or called is None or declared == called:
        return True
    return ndim is not None and declared % ndim == called % ndim
