"""Lowered tp collectives on local tensors, with DTensor's autograd.

A ``tp_collective`` boundary runs bare collectives on plain local tensors instead of
``DTensor.redistribute``. To stay exact, each one has the backward DTensor would run: the
forward op comes from ``Transition.op`` and the backward from ``Transition.grad_steps``
(``hpcodegen.plan.classify.grad_steps``, the one rule; see docs/design.md "Autograd of
lowered collectives").

Two executions of the same ops, chosen per call:

* **Eager** (the hot path): the ``ProcessGroup`` methods themselves (``allreduce``,
  ``all_gather_single``, ``reduce_scatter_single``) into a result buffer we allocate, then
  ``wait()``. ``torch.distributed.all_reduce`` and friends reach the same methods after
  7-13 us of Python checks per call on a no-op group (argument checks, a fresh options
  object, the coalescing lookup, the exception-logging wrapper); the functional collectives
  cost 26-40 us (autograd wrapper, ``AsyncCollectiveTensor``). ``CommDebugMode`` counts the
  c10d ops the methods dispatch (``allreduce_``, ``_allgather_base_``,
  ``_reduce_scatter_base_``), forward and backward alike. The input is never written: an
  all_reduce reduces a fresh copy, so tensors that autograd saved or the caller still holds
  (a residual, a gradient shared by two branches) keep their values.
* **Under ``torch.compile``** (``torch.compiler.is_compiling()``): the functional
  collectives of ``torch.distributed._functional_collectives``, which dynamo traces into
  the graph (no graph break) and inductor schedules.

Autograd without a Python ``autograd.Function`` where a C++ op has the same gradient:

* all_reduce forward with an identity backward (``P(sum) -> R``): a ``clone`` (its backward
  is the identity) reduced in place through a detached alias;
* all_gather forward with a local-chunk backward (``S(d) -> R``): the gathered shards
  concatenated with this rank's own shard in its slot, so ``cat``'s backward hands back
  exactly this rank's chunk of the gradient.

Every other pair runs through ``_Lowered`` (forward op, backward steps), and only when a
gradient can flow (grad mode on and an input that requires grad); otherwise the forward op
runs directly.

Measured on torch 2.13: gloo runs ``all_gather_single`` (concatenated output form only, not
the stacked one) and ``reduce_scatter_single``, so no all_reduce + chunk emulation is
needed; a reduce_scatter whose dim does not divide by the group size still falls back to
all_reduce + chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.classify import Step, TPOp, Transition
from hpcodegen.runtime.identity import unwrap_local

LocalFn = Callable[[torch.Tensor], torch.Tensor]

compiling = torch.compiler.is_compiling


def map_local_tensors(value: Any, leaf: LocalFn) -> Any:
    """``leaf`` applied to every local tensor of ``value``: a DTensor is unwrapped to its
    local shard, tuples and lists are walked (nested, type kept), anything else is returned
    as is. The one walker of the lowered ops and the generic engine."""
    value = unwrap_local(value)
    if isinstance(value, (tuple, list)):
        return type(value)(map_local_tensors(v, leaf) for v in value)
    return leaf(value) if isinstance(value, torch.Tensor) else value


class Comm:
    """One process group as the lowered ops use it, resolved on first eager use (the group
    may not exist yet at install): the ``ProcessGroup`` itself, its size and this rank, and
    the option objects its methods take (made once, not per call)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.pg: Any = None
        self.size = self.rank = 0

    def resolve(self) -> Any:
        """The ``ProcessGroup`` (the default group for None), set up on first call."""
        if self.pg is None:
            pg = self.group if self.group is not None else dist.group.WORLD
            self.size, self.rank = dist.get_world_size(pg), dist.get_rank(pg)
            self.sum_opts = dist.distributed_c10d.AllreduceOptions()
            self.sum_opts.reduceOp = dist.ReduceOp.SUM
            self.gather_opts = dist.distributed_c10d.AllgatherOptions()
            self.scatter_opts = dist.distributed_c10d.ReduceScatterOptions()
            self.scatter_opts.reduceOp = dist.ReduceOp.SUM
            self.pg = pg
        return self.pg

    def traced_name(self) -> tuple[str, int, int]:
        """``(group name, size, rank)``: what the compiled-model closures capture."""
        group, size, rank = self.traced()
        return group.group_name, size, rank

    def traced(self) -> tuple[Any, int, int]:
        """``(group, size, rank)`` for the functional collectives (compile-time constants)."""
        group = self.group if self.group is not None else dist.group.WORLD
        return group, dist.get_world_size(group), dist.get_rank(group)


def _comm(group: Any) -> Comm:
    return group if type(group) is Comm else Comm(group)


def gather(x: torch.Tensor, dim: int, group: Any, world: int | None = None) -> torch.Tensor:
    """all_gather of equal local shards, concatenated on ``dim`` (negative allowed).

    Differentiable as DTensor's ``Shard(dim) -> Replicate``: the backward is this rank's chunk
    of the gradient (``cat`` puts ``x`` itself in this rank's slot), no Python autograd.
    """
    comm = _comm(group)
    src = x.detach().contiguous()
    if compiling():
        group_, n, rank = comm.traced()
        out = funcol.all_gather_tensor(src, 0, group_)
    else:
        pg = comm.resolve()
        n, rank = comm.size, comm.rank
        out = src.new_empty((n * src.shape[0], *src.shape[1:]))
        pg.all_gather_single(out, src, comm.gather_opts).wait()
    return _place_gathered(x, out, dim, n, rank)


def _place_gathered(x: torch.Tensor, out: torch.Tensor, dim: int, n: int,
                    rank: int) -> torch.Tensor:
    """The all_gather result ``out`` (shards stacked on dim 0) laid out on ``dim``; when a
    gradient flows, ``x`` itself in this rank's slot (``cat``'s backward is the chunk)."""
    d = dim % x.dim()
    if n == 1:
        return x
    if not (x.requires_grad and torch.is_grad_enabled()):
        return out if d == 0 else torch.cat(out.chunk(n), d)
    parts = list(out.chunk(n))
    parts[rank] = x
    return torch.cat(parts, d)


def reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    """all_reduce(sum) into a fresh tensor (``x`` itself is left as it was).

    Eager, differentiable with an identity backward (DTensor's ``Partial -> Replicate``):
    the sum is written into a ``clone`` through a detached alias, so autograd sees only the
    clone. Under ``torch.compile`` the functional all_reduce (no autograd: wrapped by
    :func:`lowered_fn` when a gradient flows).
    """
    comm = group if type(group) is Comm else Comm(group)
    if compiling():
        group_, _, _ = comm.traced()
        return funcol.all_reduce(x, "sum", group_)
    out = x.clone(memory_format=torch.contiguous_format)
    # c10d writes in place: through a detached alias when autograd records the clone
    (comm.pg or comm.resolve()).allreduce([out.detach() if out.requires_grad else out],
                                          comm.sum_opts).wait()
    return out


def local_chunk(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """This rank's chunk of ``x`` on ``dim`` (torch.chunk's split, as DTensor's Shard)."""
    comm = _comm(group)
    if compiling():
        _, n, rank = comm.traced()
    else:
        comm.resolve()
        n, rank = comm.size, comm.rank
    return _chunk_of(x, dim % x.dim(), n, rank)


def _chunk_of(x: torch.Tensor, d: int, n: int, rank: int) -> torch.Tensor:
    parts = torch.chunk(x, n, d)
    if rank < len(parts):
        return parts[rank].contiguous()
    shape = list(x.shape)
    shape[d] = 0
    return x.new_empty(shape)


def scatter(x: torch.Tensor, dim: int, group: Any, world: int | None = None) -> torch.Tensor:
    """reduce_scatter(sum) on ``dim``; all_reduce + chunk when the dim does not divide."""
    comm = _comm(group)
    d = dim % x.dim()
    if compiling():
        group_, n, _ = comm.traced()
        if x.shape[d] % n:
            return local_chunk(reduce(x, comm), d, comm)
        return funcol.reduce_scatter_tensor(
            x.contiguous(), "sum", d, group_)
    pg = comm.resolve()
    n = comm.size
    if x.shape[d] % n:
        return local_chunk(reduce(x, comm), d, comm)
    # the c10d op scatters dim 0: lay the chunks of ``d`` out one after the other
    src = x.contiguous() if d == 0 else torch.cat(torch.chunk(x, n, d))
    out = src.new_empty((src.shape[0] // n, *src.shape[1:]))
    pg.reduce_scatter_single(out, src, comm.scatter_opts).wait()
    return out


def step_fn(kind: str, dim: int | None, group: Any, where: str) -> LocalFn:
    """The local function of one collective kind on the tp group."""
    comm = _comm(group)  # partials, not lambdas: no Python frame of their own per call
    if kind == "all_gather":
        return functools.partial(gather, dim=dim, group=comm)
    if kind == "all_reduce":
        return functools.partial(reduce, group=comm)
    if kind == "reduce_scatter":
        return functools.partial(scatter, dim=dim, group=comm)
    if kind == "chunk":
        return functools.partial(local_chunk, dim=dim, group=comm)
    raise PlanError([error("runtime.unlowerable", where,
                           f"cannot run {kind} as a lowered tp collective")])


def traced_step(kind: str, dim: int | None, group: Any) -> LocalFn:
    """:func:`step_fn`'s compiled-model form: a functional collective over constants only.

    Dynamo guards every object a compiled function reads, on every call of the compiled
    model. Traced, these closures read the group's name, size and rank and the dim (a str
    and ints); the eager partials over a :class:`Comm` add about 20 guard nodes per
    transition (the partial, its arguments, the Comm, the group lookup), about 4% of the
    compiled bench forward. The tensor math after the collective is the eager
    functions' own (:func:`_place_gathered`, :func:`_chunk_of`). Run eagerly (a graph
    break, ``force_eager``) each is :func:`step_fn`'s function, a cell dynamo never reads.
    """
    eager = step_fn(kind, dim, group, "")
    name, n, rank = _comm(group).traced_name()
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
            return _place_gathered(x, out, dim, n, rank)
        return traced_all_gather
    if kind == "reduce_scatter":
        def traced_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
            if not compiling():
                return eager(x)
            d = dim % x.dim()
            if x.shape[d] % n:
                return _chunk_of(funcol.all_reduce(x, "sum", name), d, n, rank)
            return funcol.reduce_scatter_tensor(x.contiguous(), "sum", d, name)
        return traced_reduce_scatter

    def traced_chunk(x: torch.Tensor) -> torch.Tensor:  # kind "chunk" (step_fn checked)
        return _chunk_of(x, dim % x.dim(), n, rank)
    return traced_chunk


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


def lowered_function(fwd: LocalFn | None, bwd: LocalFn | None) -> type[torch.autograd.Function]:
    """An autograd Function running ``fwd`` forward and ``bwd`` on the gradient.

    One class per transition, made at install: dynamo traces such a Function (its forward
    and backward are plain closures over the group), where a shared class taking the
    functions as ``apply`` arguments would have to store them on ``ctx``.
    """

    class Lowered(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> Any:
            return fwd(x) if fwd is not None else x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> Any:
            return bwd(grad) if bwd is not None else grad

    return Lowered


def lowered_fn(t: Transition, group: Any, where: str) -> Callable[[Any], Any]:
    """The callable executing transition ``t`` on local tensors (nested tuples walked).

    Raises:
        PlanError: ``t`` is not lowerable to one tp collective (it must go generic).
    """
    if t.op is None:
        raise PlanError([error("runtime.unlowerable", where,
                               f"{t.side}put {t.name!r} is not one tp collective")])
    comm = _comm(group)
    for s in t.grad_steps:
        if s.axis != "tp":
            raise PlanError([error("runtime.unlowerable", where,
                                   f"backward step {s} is on axis {s.axis!r}, not tp")])
    fwd = None if t.op.kind == "identity" else step_fn(t.op.kind, t.op.dim, comm, where)
    bwd = _chain([step_fn(s.kind, s.dim, comm, where) for s in t.grad_steps])
    run = apply_lowered(fwd, bwd, native=_native(t.op, t.grad_steps, fwd))
    run.traced = functools.partial(traced_transition, t, comm)  # type: ignore[attr-defined]
    return run


def _native(op: TPOp, steps: Sequence[Step], fwd: LocalFn | None) -> LocalFn | None:
    """``fwd`` when its own autograd (C++ ops, see :func:`gather` / :func:`reduce`) is the
    transition's backward: an all_reduce with no backward step, an all_gather whose
    backward is the chunk on the same dim. None otherwise."""
    if op.kind == "all_reduce" and not steps:
        return fwd
    if op.kind == "all_gather" and len(steps) == 1 and steps[0].kind == "chunk" \
            and steps[0].dim == op.dim and op.dim is not None:
        return fwd
    return None


functorch_active = torch._C._are_functorch_transforms_active


def direct_apply(function: type[torch.autograd.Function]) -> Callable[[Any], Any]:
    """``function.apply`` without ``autograd.Function.apply``'s Python layer.

    That layer (a ``setup_context`` lookup, functorch's dead-wrapper unwrap) costs about
    9 us per call, half of what a Function with a one-line forward costs in all; a Function
    without ``setup_context`` ends in the C ``_FunctionBase.apply`` it wraps. Used eagerly
    only: under ``torch.compile`` dynamo needs ``function.apply`` itself to trace the
    Function, and under functorch transforms the layer is what refuses it. Falls back to
    ``function.apply`` where this torch has no such base.
    """
    base = getattr(torch._C, "_FunctionBase", None)
    descriptor = vars(base).get("apply") if base is not None else None
    if descriptor is None or function.setup_context is not torch.autograd.Function.setup_context:
        return function.apply
    return descriptor.__get__(None, function)


def apply_lowered(fwd: LocalFn | None, bwd: LocalFn | None,
                  native: LocalFn | None = None) -> Callable[[Any], Any]:
    """Wrap ``fwd``/``bwd`` as a function over values (tensors, tuples of them, None).

    Eager, ``native`` (a forward whose own autograd is already ``bwd``) runs as it is. Else
    the autograd Function runs only when a gradient can flow through it (grad mode on and
    an input that requires grad); otherwise ``fwd`` runs directly (identity: the value
    itself), which records the same nothing at a fraction of the cost. Under
    ``torch.compile`` the Function is what dynamo traces.
    """
    plain = torch.Tensor
    grad_enabled = torch.is_grad_enabled
    function = lowered_function(fwd, bwd) if fwd is not None or bwd is not None else None
    apply = function.apply if function is not None else None
    direct = direct_apply(function) if function is not None else None

    def on_tensor(tensor: torch.Tensor) -> torch.Tensor:
        if apply is None:
            return tensor
        if native is not None and not compiling():
            return native(tensor)
        if tensor.requires_grad:
            if grad_enabled():
                return apply(tensor) if compiling() or functorch_active() else direct(tensor)
            if fwd is None:  # as the Function's view under no_grad: no graph to follow
                return tensor.detach()
        return fwd(tensor) if fwd is not None else tensor

    if native is not None:
        def run(tensor: Any) -> Any:  # named as TPOps' methods, which may be bound to it
            if type(tensor) is plain and not compiling():  # the hot path
                return native(tensor)
            return map_local_tensors(tensor, on_tensor)
        return run

    def run(tensor: Any) -> Any:
        if type(tensor) is plain:  # the hot path: a local tensor, nothing to walk
            return on_tensor(tensor)
        return map_local_tensors(tensor, on_tensor)
    return run


def traced_transition(t: Transition, comm: Comm,
                      mismatch: Callable[[Any, int], Any] | None = None) -> Callable[..., Any]:
    """Transition ``t``'s compiled-model form: :func:`traced_lowered` over
    :func:`traced_step`'s closures (the same collectives as the eager ones)."""
    assert t.op is not None  # lowered_fn refused the others
    fwd = None if t.op.kind == "identity" else traced_step(t.op.kind, t.op.dim, comm)
    bwd = _chain([traced_step(s.kind, s.dim, comm) for s in t.grad_steps])
    return traced_lowered(fwd, bwd, t.op.dim, mismatch)


def traced_lowered(fwd: LocalFn | None, bwd: LocalFn | None, declared: int | None = None,
                   mismatch: Callable[[Any, int], Any] | None = None) -> Callable[..., Any]:
    """The compiled-model form of a lowered transition (see :meth:`TPOps.bind_traced`).

    What :func:`apply_lowered` runs under ``torch.compile``: the per-transition autograd
    Function when a gradient can flow, ``fwd`` otherwise. Dynamo guards every object it
    reads, on every call of the compiled model, so each path reads as few cells as it can:
    a no-grad forward reads ``fwd`` alone (``apply`` only when a gradient flows), and only
    a kind that takes a dim gets the ``dim`` parameter. A dim other than ``declared`` goes
    to ``mismatch(value, dim)`` (the eager matching: equal modulo the rank, or a
    PlanError).
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

    def bind_traced(self) -> bool:
        """Bind each declared kind's method to its transition's compiled-model form.

        Called on the boundaries a ``torch.compile`` scope covers
        (:func:`hpcodegen.runtime.compile.compile_parallelized`): the same collectives and
        autograd as the eager methods under ``torch.compiler.is_compiling()``, with a
        fraction of the objects dynamo guards on every call; run eagerly (a graph break,
        ``force_eager``) they stay exact, through the functional collectives. Only when no
        kind is declared twice (otherwise the call order picks the transition and the
        eager methods stay); False then.
        """
        kinds = [op.kind for op, _ in self._calls]
        if len(set(kinds)) != len(kinds):
            return False
        if "identity" not in kinds:  # an undeclared ``to_local`` only unwraps
            self.to_local = traced_lowered(None, None)  # type: ignore[method-assign]
        for op, fn in self._calls:
            traced = getattr(fn, "traced", None)  # an undeclared identity has none
            mismatch = functools.partial(self._mismatch, op.kind)
            setattr(self, _METHOD[op.kind], traced(mismatch=mismatch) if traced is not None
                    else traced_lowered(None, None))
        return True

    def _mismatch(self, kind: str, value: Any, dim: int) -> Any:
        return self._call(kind, dim, value)  # equal modulo the rank, or a PlanError

    def __repr__(self) -> str:
        return f"TPOps({self.fqn}: {', '.join(str(op) for op, _ in self._calls)})"


_METHOD = {"identity": "to_local", "all_gather": "all_gather", "all_reduce": "all_reduce",
           "reduce_scatter": "reduce_scatter"}


def _same_dim(declared: int | None, called: int | None, ndim: int | None) -> bool:
    """Equal dims, also when one counts from the end (``-1`` vs ``2`` on a 3-D tensor)."""
    if declared is None or called is None or declared == called:
        return True
    return ndim is not None and declared % ndim == called % ndim
