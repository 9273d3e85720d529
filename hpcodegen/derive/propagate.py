"""The symbolic run: the model's forward and backward on DTensors of the plan's placements.

On the meta device (no memory), over a fake process group (:mod:`.world`), every planned
parameter becomes a DTensor of its declared placements on the derived axes, and every
boundary (an entry with transitions) is hooked the way the runtime installs it: its inputs
are redistributed from what arrives to ``in_dst``, its outputs taken as the forward computes
them and redistributed to ``out_dst``. DTensor's sharding propagation decides, op by op,
what each output is. What the run records (:class:`~hpcodegen.derive.record.Derivation`):

* each boundary output as computed (``Partial`` where the compute was split) and each
  input as it arrived;
* each parameter gradient's placement after one backward: ``Partial`` means each rank
  holds a share that must be summed;
* every *implicit* redistribution in the forward: an op whose operands DTensor had to move
  first (a partial value into a nonlinearity, a replicated bias added to a partial sum, a
  weight split on the wrong dim). The runtime runs the model's local code on local shards
  and never inserts such a collective, so each is a shape error or a wrong value there.
  Parameters of ``tp_rank0_params`` are placed ``Partial`` (applied once, by one rank), so
  a missing or needless listing shows up as such a move.

Two injected computes are hpcodegen's own and are propagated with their contract over tp:
the expert dispatch (over tp it is the experts' own compute, since the ep exchange permutes
tokens over an axis that is not meshed; under ``--sp`` its tp gather and reduce-scatter are
modelled, :meth:`_Run._gather_rows`) and the split RMS norm (its own arithmetic with the
sum over tp all-reduced, :meth:`Move.is_tp_sum`). Other modules whose compute an injection
replaces (``local_compute_fn``) are opaque: their inputs are redistributed as declared and
their outputs taken as declared (placements and grads inside them are left to the plan
check's rules). Mixture-of-experts
kernels run their data-independent ``batched_mm`` form. Only axes that split the model's
compute are derived (tp and any other non-data axis of size > 1); ``ep``, ``cp``, ``dp`` and
``pp`` carry different data per rank and are checked by rules. Where an op cannot be
propagated at all, the run stops and says where (``Derivation.failed``); the checks made so
far and the plan check's rules stand.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from hpcodegen.derive.local_ops import CURRENT, local_rules
from hpcodegen.derive.record import Derivation, ImplicitComm, Move, Named, Step
from hpcodegen.derive.world import fake_mesh, live_axes
from hpcodegen.placement import (
    REPLICATE,
    Partial,
    Placement,
    StridedShard,
    from_torch,
    is_shard,
)
from hpcodegen.plan.entry import join_fqn
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.moe import gathers_over_tp, is_ep_dispatch
from hpcodegen.plan.norms import is_sharded_norm
from hpcodegen.plan.types import TP, Plan, PlanEntry

#: ops whose local form on a shard DTensor has no rule for (it would gather instead)
UNEXPRESSED = frozenset({"aten.repeat", "aten.repeat_interleave"})
#: ops whose operand narrowed from replicated to a shard is a shape error in the local run:
#: the runtime feeds a matmul the whole activation the derivation calls replicated (a
#: row-wise split weight then meets a full-width input), never one local code cut to size
CONTRACTIONS = frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm",
                          "aten.matmul", "aten.linear"})
#: axes whose ranks hold different data (or stages), not a split of one compute
DATA_AXES = frozenset({"dp", "ep", "cp", "pp", "dp_replicate", "dp_shard"})
BATCH, SEQ = 2, 8


def derived_axes(plan: Plan, sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """``{axis: size}`` the derivation meshes: live (size > 1) and not a data axis."""
    sizes = dict(plan.dims.sizes) if sizes is None else dict(sizes)
    return {a: n for a, n in live_axes(sizes, plan.axes).items() if a not in DATA_AXES}


def show(p: Any) -> str:
    """A torch placement as an hpcodegen placement string."""
    return str(from_torch(p))


def _strided(p: Any) -> bool:
    return isinstance(from_torch(p), StridedShard)


def _named(placements: tuple, axes: tuple[str, ...]) -> Named:
    return {a: show(p) for a, p in zip(axes, placements, strict=False)}


class _Run:
    """The state of one symbolic run (hooks, the boundary stack, what was recorded)."""

    def __init__(self, plan: Plan, mesh: Any, record: Derivation,
                 replaced: Mapping[str, str]) -> None:
        self.plan, self.mesh, self.record = plan, mesh, record
        self.axes: tuple[str, ...] = tuple(mesh.mesh_dim_names)
        self.stack: list[str] = []
        self.recording = False
        self.param_names: dict[int, str] = {}
        #: opaque region -> the placements of its first DTensor input (its output's layout)
        self.region_in: dict[str, tuple | None] = {}
        #: opaque region -> its DTensor parameters set aside while it runs on plain tensors
        self.swapped: dict[str, list[tuple[Any, str, Any]]] = {}
        #: injected compute (``local_compute_fn``) or a declared black-box local region
        #: (``region_dispatch: false``) -> why it is not derived
        #: (hpcodegen's ep dispatch and split norm are not among them: :attr:`dispatch`,
        #: :attr:`norms`)
        self.opaque = {fqn: "its compute is an injected local_compute_fn"
                       for inj in plan.injections or () if inj.local_compute_fn is not None
                       and not is_ep_dispatch(inj) and not is_sharded_norm(inj)
                       for fqn in inj.fqns}
        self.opaque.update({fqn: "a black-box local region (region_dispatch: false)"
                            for fqn, e in plan.entries.items()
                            if e.region_dispatch is False and fqn not in self.opaque})
        self.opaque.update({fqn: why for fqn, why in replaced.items() if fqn not in self.opaque})
        #: experts region whose compute is hpcodegen's ep dispatch -> whether the dispatch
        #: gathers its rows over tp (:func:`~hpcodegen.plan.moe.gathers_over_tp`). Over the
        #: derived axes the dispatch is its module's own compute: the ep exchange permutes
        #: tokens between ranks of an axis that is not meshed (placements over tp pass
        #: through it), so the experts' tp-split compute propagates as it does without ep
        self.dispatch = {fqn: TP in self.axes and gathers_over_tp(plan.entries.get(fqn))
                         for inj in plan.injections or () if is_ep_dispatch(inj)
                         for fqn in inj.fqns if fqn not in self.opaque}
        #: norms whose compute is hpcodegen's split RMS norm: the module's own arithmetic
        #: (generate checks it is) with the per-token sum over tp all-reduced, so a partial
        #: taken whole inside it is that all_reduce (:meth:`Move.is_tp_sum`); nothing else moves
        self.norms = {fqn for inj in plan.injections or () if is_sharded_norm(inj)
                      for fqn in inj.fqns if fqn not in self.opaque}
        #: boundary -> the placements its first strided-sharded input arrived with
        self.rows: dict[str, tuple] = {}

    # -- placements ----------------------------------------------------------------------
    def torch_placements(self, named: Mapping[str, Placement] | None, ndim: int,
                         rank0: bool = False) -> tuple:
        from hpcodegen.runtime.mesh import to_torch_placements

        chosen = [(named or EMPTY).get(a, REPLICATE) for a in self.axes]
        if rank0:
            chosen = [Partial() if a == TP else p for a, p in zip(self.axes, chosen, strict=False)]
        return to_torch_placements(chosen, ndim)

    def placed(self, value: Any, placements: tuple) -> Any:
        """A differentiable DTensor of ``value``'s global shape at ``placements`` (values
        are meta: only the shard's shape matters)."""
        import torch
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        if isinstance(value, DTensor):
            value = value.full_tensor()
        shape, _ = compute_local_shape_and_global_offset(value.shape, self.mesh, placements)
        local = value
        for dim, (want, have) in enumerate(zip(shape, value.shape, strict=False)):
            if want != have:
                local = local.narrow(dim, 0, want)
        local = local.contiguous()
        if not value.is_floating_point():
            local = local.detach()
        return DTensor.from_local(local, self.mesh, placements, run_check=False,
                                  shape=value.shape,
                                  stride=torch.empty(value.shape, device="meta").stride())

    def as_arrived(self, fqn: str, placements: tuple) -> tuple:
        """``placements`` with a declared ``S(d)`` read as the rows this boundary's input
        arrived with where that was ``SS(d,k)`` (tokens flattened from a sequence shard:
        each rank's rows interleaved across the batch). The runtime gathers and splits such
        rows in rank order, so ``S(d)`` there means each rank's own rows again, not a
        contiguous block of the global order."""
        from torch.distributed.tensor import Shard as TShard

        rows = self.rows.get(fqn)
        if rows is None:
            return placements
        return tuple(r if type(p) is TShard and _strided(r) and r.dim == p.dim else p
                     for p, r in zip(placements, rows, strict=False))

    def as_declared(self, fqn: str, placements: tuple) -> Named:
        """``placements`` named, with the rows this boundary's input arrived with
        (``SS(d,k)``, :meth:`as_arrived`) read as the ``S(d)`` a plan declares for them."""
        from torch.distributed.tensor import Shard as TShard

        rows = self.rows.get(fqn) or ()
        return _named(tuple(TShard(p.dim) if p in rows and _strided(p) else p
                            for p in placements), self.axes)

    def fence(self, value: Any) -> Any:
        """``value`` as the runtime hands it on at a transition: the same placements, and in
        backward the gradient redistributed to them (the transition's own backward
        collective), so a partial input gradient is summed where the runtime sums it."""
        import torch
        from torch.distributed.tensor import DTensor

        if not isinstance(value, DTensor) or not value.requires_grad \
                or not torch.is_floating_point(value):
            return value
        return DTensor.from_local(value.to_local(), self.mesh, value.placements,
                                  run_check=False, shape=value.shape, stride=value.stride())

    # -- parameters ----------------------------------------------------------------------
    def place_parameters(self, model: Any) -> None:
        import torch
        from torch import nn
        from torch.distributed.tensor import DTensor

        made: dict[tuple[int, tuple], Any] = {}
        for fqn, entry in self.plan.entries.items():
            # applied once over tp (by one rank, or after the reduction): Partial
            rank0 = {*(entry.tp_rank0_params or ()), *(entry.deferred_bias_params or ())}
            for rel, named in (entry.params or EMPTY).items():
                name = join_fqn(fqn, rel)
                owner_name, _, attr = name.rpartition(".")
                try:
                    owner = model.get_submodule(owner_name) if owner_name else model
                except AttributeError:
                    continue  # not in this model (the model check reports it)
                param = getattr(owner, attr, None)
                if not isinstance(param, nn.Parameter) or isinstance(param, DTensor):
                    continue
                placements = self.torch_placements(named, param.dim(), rel in rank0)
                key = (id(param), placements)
                if key not in made:
                    with torch.no_grad():
                        value = self.placed(param.detach(), placements)
                    made[key] = nn.Parameter(value, requires_grad=param.requires_grad)
                setattr(owner, attr, made[key])
                self.param_names[id(made[key]._local_tensor)] = name

    # -- boundaries ----------------------------------------------------------------------
    def hook(self, model: Any) -> list[Any]:
        handles = []
        targets = [f for f, e in self.plan.entries.items() if e.boundary]
        for fqn in dict.fromkeys([*targets, *self.opaque, *self.dispatch, *self.norms]):
            try:
                module = model.get_submodule(fqn) if fqn else model
            except AttributeError:
                continue
            handles.append(module.register_forward_pre_hook(
                self._pre(fqn, module), with_kwargs=True))
            handles.append(module.register_forward_hook(self._post(fqn)))
        return handles

    def _to_input(self, fqn: str, name: str, value: Any) -> Any:
        import torch
        from torch.distributed.tensor import DTensor

        entry = self.plan.entries.get(fqn) or PlanEntry(fqn=fqn)
        if not isinstance(value, torch.Tensor):
            return value
        src = (entry.in_src or EMPTY).get(name)
        dst = (entry.in_dst or EMPTY).get(name, src)
        if isinstance(value, DTensor):
            self.record.inputs.setdefault((fqn, name), _named(value.placements, self.axes))
            if any(_strided(p) for p in value.placements):
                self.rows.setdefault(fqn, tuple(value.placements))
        else:
            value = self.placed(value, self.torch_placements(src, value.dim()))
        want = self.as_arrived(fqn, self.torch_placements(dst, value.dim()))
        if any(isinstance(p, Partial) for p in (dst or EMPTY).values()):
            return self.fence(value)  # refused by the plan check (plan.invalid_redistribute)
        if tuple(value.placements) != want:
            value = value.redistribute(self.mesh, want)
        return self.fence(value)

    def _inside_opaque(self) -> bool:
        return any(f in self.opaque for f in self.stack)

    def _pre(self, fqn: str, module: Any) -> Any:
        try:
            sig: inspect.Signature | None = inspect.signature(module.forward)
        except (TypeError, ValueError):
            sig = None
        entry = self.plan.entries.get(fqn) or PlanEntry(fqn=fqn)
        names = {*(entry.in_src or EMPTY), *(entry.in_dst or EMPTY)}
        alias: dict[str, str] = {}  # forward parameter -> plan input name
        if sig is not None and len(names) == 1 and not names & set(sig.parameters):
            # one input under another name binds to the first argument (the runtime's rule)
            first = next(iter(sig.parameters), None)
            if first is not None:
                alias[first] = next(iter(names))

        def pre(_m: Any, args: tuple, kwargs: dict) -> Any:
            nested = self._inside_opaque()
            self.stack.append(fqn)
            if nested:
                return None  # a boundary inside foreign or injected code: not derived
            if sig is None:
                if args and names:
                    args = (self._to_input(fqn, sorted(names)[0], args[0]), *args[1:])
            else:
                try:
                    bound = sig.bind_partial(*args, **kwargs)
                except TypeError:
                    return None
                for key, value in list(bound.arguments.items()):
                    if sig.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
                        bound.arguments[key] = {
                            k: self._to_input(fqn, k, v) if k in names else v
                            for k, v in value.items()}
                    elif key in names or key in alias:
                        bound.arguments[key] = self._to_input(fqn, alias.get(key, key), value)
                if fqn in self.dispatch:
                    self._paired_rows(fqn, bound.arguments)
                if fqn in self.norms:
                    self._split_features(fqn, bound.arguments)
                args, kwargs = bound.args, bound.kwargs
            if fqn in self.opaque:
                return self._enter_opaque(fqn, module, args, kwargs)
            if self.dispatch.get(fqn):
                return self._gather_rows(fqn, args, kwargs)
            return args, kwargs
        return pre

    def _enter_opaque(self, fqn: str, module: Any, args: tuple, kwargs: dict) -> Any:
        """Run an opaque region on plain global tensors (its code is not what the runtime
        runs there, so it is not propagated): inputs gathered, parameters whole; the
        layout of its first DTensor input is kept for its output."""
        from torch import nn
        from torch.distributed.tensor import DTensor

        first = next((t for t in (*args, *kwargs.values()) if isinstance(t, DTensor)), None)
        self.region_in[fqn] = None if first is None else tuple(first.placements)
        swapped = []
        for name, param in list(module.named_parameters()):
            if isinstance(param, DTensor):
                owner_name, _, attr = name.rpartition(".")
                owner = module.get_submodule(owner_name) if owner_name else module
                plain = nn.Parameter(param.detach().full_tensor(),
                                     requires_grad=param.requires_grad)
                setattr(owner, attr, plain)
                swapped.append((owner, attr, param))
        self.swapped[fqn] = swapped

        def plain(value: Any) -> Any:
            return value.full_tensor() if isinstance(value, DTensor) else value
        return tuple(map(plain, args)), {k: plain(v) for k, v in kwargs.items()}

    def _paired_rows(self, fqn: str, inputs: Mapping[str, Any]) -> None:
        """The dispatch pairs its inputs row by row (each token's hidden state with its
        expert indices and routing weights, gathered over tp alike): an input laid out over
        tp otherwise than the first (one gathered whole beside a split one) pairs the rows
        of different tokens, a shape error or wrong routing in the runtime's dispatch."""
        from torch.distributed.tensor import DTensor

        tp = self.axes.index(TP) if TP in self.axes else None
        placed = [(name, show(v.placements[tp])) for name, v in inputs.items()
                  if tp is not None and isinstance(v, DTensor)]
        moves = tuple(Move((), note=f"{name} {got} on tp beside {placed[0][0]} {placed[0][1]}")
                      for name, got in placed[1:] if got != placed[0][1])
        if moves and self.recording:
            self.record.implicit.append(ImplicitComm(
                fqn, "ep_dispatch", moves, "hpcodegen.runtime.moe.ep_dispatch (its rows)"))

    def _split_features(self, fqn: str, inputs: Mapping[str, Any]) -> None:
        """The split norm's contract: its input split over tp on the features it
        normalizes (the last dim), as its weight is; it divides by the local width times
        tp, so on whole features it would average over tp times the width."""
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import Shard as TShard

        x = next((v for v in inputs.values() if isinstance(v, DTensor)), None)
        if x is None or TP not in self.axes or not self.recording:
            return
        got = x.placements[self.axes.index(TP)]
        if not (type(got) is TShard and got.dim % x.dim() == x.dim() - 1):
            self.record.implicit.append(ImplicitComm(
                fqn, "sharded_rms_norm", (Move((), note=f"its input {show(got)} on tp, not "
                                               "split on its last dim (the features it sums "
                                               "over tp)"),),
                "hpcodegen.runtime.norms.sharded_rms_norm"))

    def _gather_rows(self, fqn: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The dispatch's ``tp_gather``: every tensor input sharded over tp (each tp rank
        routed its own rows) gathered whole over tp before its tp-split experts run; the
        layout its first DTensor input arrived with is kept for :meth:`_scatter_rows`."""
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import Replicate as TReplicate

        tp = self.axes.index(TP)
        first = next((t for t in (*args, *kwargs.values()) if isinstance(t, DTensor)), None)
        self.region_in[fqn] = None if first is None else tuple(first.placements)

        def whole(value: Any) -> Any:
            if not isinstance(value, DTensor) or value.placements[tp].is_replicate():
                return value
            want = list(value.placements)
            want[tp] = TReplicate()
            return self.fence(value.redistribute(self.mesh, tuple(want)))
        return tuple(map(whole, args)), {k: whole(v) for k, v in kwargs.items()}

    def _scatter_rows(self, fqn: str, value: Any) -> Any:
        """The dispatch's ``tp_scatter``: the experts' partial results summed back onto the
        rows each tp rank routed (the layout :meth:`_gather_rows` kept). A result that is
        not partial over tp is left as computed (the scatter would sum tp whole copies:
        the output's comparison with the declaration refuses it)."""
        from torch.distributed.tensor import DTensor

        rows = self.region_in.get(fqn)
        if not isinstance(value, DTensor) or rows is None \
                or not value.placements[self.axes.index(TP)].is_partial():
            return value
        return value.redistribute(self.mesh, rows)

    def _post(self, fqn: str) -> Any:
        entry = self.plan.entries.get(fqn) or PlanEntry(fqn=fqn)

        def post(_m: Any, _args: Any, output: Any) -> Any:
            import torch
            from torch.distributed.tensor import DTensor

            if self.stack and self.stack[-1] == fqn:
                self.stack.pop()
            if self._inside_opaque():
                return None
            for owner, attr, param in self.swapped.pop(fqn, ()):
                setattr(owner, attr, param)
            single = isinstance(output, torch.Tensor)
            outs = [output] if single else list(output) if isinstance(output, (tuple, list)) \
                else None
            if outs is None:
                return None
            layout = self.region_in.get(fqn)
            if fqn in self.opaque and not entry.out_src and isinstance(outs[0], torch.Tensor):
                fits = layout is not None and outs[0].dim() > max(
                    (p.dim for p in layout if hasattr(p, "dim")), default=-1)
                # a black box without declared outputs computes locally, token by token:
                # its output keeps its input's layout
                outs[0] = self.fence(self.placed(outs[0], layout if fits else tuple(
                    self.torch_placements(None, outs[0].dim()))))
            for name, src in (entry.out_src or EMPTY).items():
                index = entry.output_index(name)
                value = outs[index] if index < len(outs) else None
                if not isinstance(value, torch.Tensor):
                    continue
                if fqn in self.opaque or not isinstance(value, DTensor):
                    value = self.placed(value, self.as_arrived(
                        fqn, self.torch_placements(src, value.dim())))
                else:
                    if self.dispatch.get(fqn):
                        value = self._scatter_rows(fqn, value)
                    self.record.outputs.setdefault(
                        (fqn, name), (self.as_declared(fqn, value.placements), value.dim()))
                dst = (entry.out_dst or EMPTY).get(name, src)
                want = self.as_arrived(fqn, self.torch_placements(dst, value.dim()))
                if tuple(value.placements) != want and not any(
                        isinstance(p, Partial) for p in (dst or EMPTY).values()):
                    value = value.redistribute(self.mesh, want)
                outs[index] = self.fence(value)
            if single:
                return outs[0]
            return type(output)(outs) if isinstance(output, list) else tuple(outs)
        return post

    # -- implicit redistributions ----------------------------------------------------------
    @contextmanager
    def watching(self) -> Iterator[None]:
        """Record every redistribution DTensor inserts inside an op (not those of the
        boundary hooks, which are ``redistribute`` calls, not op dispatch)."""
        from torch.distributed.tensor._dispatch import OpDispatcher
        from torch.distributed.tensor._dtensor_spec import DTensorSpec
        from torch.utils import _pytree as pytree

        from hpcodegen.tracer.ops import op_name

        original = OpDispatcher.__dict__["redistribute_local_args"]
        run = self

        def watched(op_info: Any, schema: Any, use_val: bool) -> None:
            if not run.recording and any(
                    isinstance(spec, DTensorSpec) and any(p.is_partial() for p in spec.placements)
                    for spec in op_info.flat_args_schema):
                # a reduction DTensor inserts in backward: a gradient it made whole, which the
                # runtime's local backward leaves partial
                run.record.backward_reductions += 1
            if run.recording and not run._inside_opaque():
                wanted = (tuple(pytree.tree_leaves(schema.args_schema))
                          if op_info.args_tree_spec is not None else schema.args_schema)
                moves = []
                name = op_name((op_info.schema or schema).op)
                # a split norm computes on its local features and weight as they are:
                # nothing is cut to size there either
                in_norm = any(f in run.norms for f in run.stack)
                contracting = name in CONTRACTIONS or in_norm
                for i, spec in enumerate(op_info.flat_args_schema):
                    if isinstance(spec, DTensorSpec) and i < len(wanted) \
                            and spec != wanted[i] and not _masked_lookup(
                            op_info.local_args[i], wanted[i]) \
                            and (contracting or not _narrowing(spec, wanted[i])):
                        who = run.param_names.get(id(op_info.local_args[i]))
                        moves.append(_move(spec, wanted[i], run.axes, who))
                if in_norm:
                    # a split norm's per-token sum of squares (a partial over tp where the
                    # features are split) taken whole is the norm's own all_reduce
                    moves = [m for m in moves if not m.is_tp_sum(TP)]
                unexpressed = name in UNEXPRESSED or any(m.from_strided for m in moves)
                if moves and unexpressed and run.stack:
                    # a layout DTensor cannot express (a fused SS output, a repeat over a
                    # sharded dim): the boundary is left to the rules, not guessed
                    run.opaque.setdefault(run.stack[-1], f"{name} on a layout propagation "
                                          "cannot express")
                elif moves:
                    run.record.implicit.append(ImplicitComm(
                        run.stack[-1] if run.stack else None,
                        op_name((op_info.schema or schema).op),
                        tuple(moves), _model_line()))
            return original.__func__(op_info, schema, use_val)

        import torch
        from torch.distributed.tensor import DTensor

        handlers = DTensor._op_dispatcher._custom_op_handlers
        aten = torch.ops.aten
        rules = local_rules(aten)
        OpDispatcher.redistribute_local_args = staticmethod(watched)
        handlers.update(rules)
        CURRENT.append(self)
        try:
            yield
        finally:
            CURRENT.remove(self)
            OpDispatcher.redistribute_local_args = original
            for op in rules:
                handlers.pop(op, None)


def _narrowing(spec: Any, want: Any) -> bool:
    """Every move takes a replicated operand to a shard: each rank cuts its own part, no
    collective. The runtime's local code made that operand at the local shape already
    (``k_rot.expand(-1, k_nope.shape[1], ...)`` over this rank's heads), so it is no
    disagreement."""
    from torch.distributed.tensor import Replicate as TReplicate
    from torch.distributed.tensor import Shard as TShard

    moved = [(a, b) for a, b in zip(spec.placements, want.placements, strict=False) if a != b]
    return bool(moved) and all(isinstance(a, TReplicate) and isinstance(b, TShard)
                               for a, b in moved)


def _masked_lookup(local: Any, want: Any) -> bool:
    """An index tensor taken to ``Partial``: the masked lookup of a vocab-sharded table
    (each rank zeroes the ids outside its rows), which moves nothing between ranks."""
    from torch.distributed.tensor import Partial as TPartial

    return not local.is_floating_point() and any(isinstance(p, TPartial)
                                                 for p in want.placements)


def _model_line() -> str:
    """``file:line`` of the model code running the current op (torch and hpcodegen frames
    skipped)."""
    import sys

    frame = sys._getframe(1)
    while frame is not None and ("/torch/" in frame.f_code.co_filename
                                 or "/hpcodegen/" in frame.f_code.co_filename):
        frame = frame.f_back
    return "" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _move(spec: Any, want: Any, axes: tuple[str, ...], who: str | None) -> Move:
    return Move(tuple(Step(axis, from_torch(a), from_torch(b))
                      for axis, a, b in zip(axes, spec.placements, want.placements, strict=False)
                      if a != b), who)


def _batched_experts(model: Any) -> None:
    """Mixture-of-experts kernels in their data-independent ``batched_mm`` form (every
    token's experts gathered by index, no ``nonzero``), which runs on meta DTensors."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if hasattr(module, "is_concatenated") and hasattr(module, "has_gate") \
                and config is not None:
            config._experts_implementation = "batched_mm"


def derive(model: Any, plan: Plan, sizes: Mapping[str, int] | None = None,
           replaced: Mapping[str, str] | None = None) -> Derivation:
    """Run ``model`` (built on the meta device, unparallelized; it is consumed) under
    ``plan`` at ``sizes`` (default: the plan's own) and record what propagates.
    ``replaced``: modules the runtime replaces with foreign code (``module_overrides``)
    -> why; they are opaque like injected compute."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import implicit_replication

    from hpcodegen.hf import no_cache_kwargs
    from hpcodegen.tracer.model import quiet_fake_tensors, token_ids, use_eager

    all_sizes = dict(plan.dims.sizes) if sizes is None else dict(sizes)
    record = Derivation(sizes=all_sizes)
    axes = derived_axes(plan, all_sizes)
    record.axes = dict(axes)
    if not axes:
        record.skipped = ("no axis that splits the compute has more than one rank "
                          f"({', '.join(f'{a}={n}' for a, n in all_sizes.items()) or 'none'}): "
                          "nothing moves between ranks")
        return record
    use_eager(model)
    _batched_experts(model)
    try:
        with fake_mesh(axes) as mesh, quiet_fake_tensors():
            run = _Run(plan, mesh, record, replaced or {})
            record.opaque.update(run.opaque)
            run.place_parameters(model)
            handles = run.hook(model)
            try:
                with run.watching(), implicit_replication():
                    run.recording = True
                    ids = token_ids(BATCH, SEQ)
                    # an explicit all-ones mask: transformers' packed-sequence probe reads
                    # values, which meta tensors lack
                    out = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                **no_cache_kwargs(model))
                    run.recording = False
                    logits = out[0] if isinstance(out, tuple) else getattr(
                        out, "logits", None)
                    if logits is None:
                        logits = getattr(out, "last_hidden_state", None)
                    if isinstance(logits, DTensor):
                        logits = logits.full_tensor()
                    if isinstance(logits, torch.Tensor) and logits.requires_grad:
                        logits.float().sum().backward()
            finally:
                for handle in handles:
                    handle.remove()
            record.opaque.update(run.opaque)  # and those found opaque on the way
            _grads(run, model, record)
    except Exception as exc:  # an op with no propagation rule, data-dependent code, ...
        where = f" (in {run.stack[-1]})" if "run" in locals() and run.stack else ""
        record.failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}" \
                        f"{where}"
    return record


def _grads(run: _Run, model: Any, record: Derivation) -> None:
    from torch.distributed.tensor import DTensor

    for fqn, entry in run.plan.entries.items():
        rank0 = set(entry.tp_rank0_params or ())
        for rel in entry.params or EMPTY:
            name = join_fqn(fqn, rel)
            owner_name, _, attr = name.rpartition(".")
            try:
                owner = model.get_submodule(owner_name) if owner_name else model
            except AttributeError:
                continue
            param = getattr(owner, attr, None)
            if not isinstance(param, DTensor):
                continue
            if rel in (entry.deferred_bias_params or ()):
                continue  # added after the reduction: the plan check's rule judges it
            grad = param.grad
            kinds: dict[str, str] = {}
            for axis, p in zip(run.axes, param.placements, strict=False):
                if is_shard(from_torch(p)):
                    kinds[axis] = "sharded"  # its gradient is its shard's: never summed
                elif rel in rank0 and axis == TP:
                    kinds[axis] = "partial"  # one rank applies it: the others' share is 0
                elif grad is None:
                    kinds[axis] = "none"
                else:
                    g = from_torch(grad.placements[run.axes.index(axis)])
                    kinds[axis] = ("partial" if isinstance(g, Partial) else "sharded"
                                   if is_shard(g) else "full")
            record.grads[(fqn, rel)] = kinds
