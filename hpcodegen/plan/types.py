"""The frozen, typed plan of an artifact: ``codegen_meta.json`` parsed once (pure, no torch).

Declaration only: kw-only, slotted, frozen dataclasses, one docstring under each field
(the JSON key it mirrors, and an ``e.g.``). :mod:`hpcodegen.plan.codec` builds a
:class:`Plan` from a meta and writes it back byte for byte; the loader
(:func:`hpcodegen.verify.load_checked_meta`) builds it once, after verify's checks passed,
and every phase afterwards reads the Plan instead of the dict.

Shape::

    Plan
      param_plan      {module fqn: PlanEntry}      params, in_src/in_dst/out_src/out_dst ...
        PlanEntry.transitions("in"|"out") -> PlannedTransition(name, src, dst)
      injections      (Injection(match, inner_wrapper: Target | str, local_compute_fn ...))
      parallel_dims   ParallelDims(sizes {"tp": 2, ...}, sequence_parallel, loss_parallel)
      mesh_dim_names, tied_pairs, special_handlers, boundary_classes, entrypoints, ...
      provenance      Provenance(signature, source, outputs ...)   (plan/provenance.py)
      .axes  .entries  .parameters()  .injections_by_fqn()        (derived views)

Placements are :mod:`hpcodegen.placement` objects (the one parser), a *named* placement a
``FrozenMap`` ``{axis: Placement}``. A field that is ``None`` was absent from the JSON; a
key no field models (another generator's, or a known key whose value is ``null``) is kept
verbatim in the ``extra`` of the object it appeared in, so nothing is lost on the way back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hpcodegen.placement import (
    REPLICATE,
    Partial,
    Placement,
    Shard,
    is_shard,
)
from hpcodegen.plan.frozen import EMPTY, FrozenMap
from hpcodegen.plan.pipeline import Pipeline
from hpcodegen.plan.provenance import NO_PROVENANCE, Provenance

#: ``{axis: placement}``, e.g. ``{"tp": Shard(0)}``; a missing axis reads as ``R``.
NamedPlacement = FrozenMap[str, Placement]
#: ``{input/output/parameter name: NamedPlacement}``.
NamedPlacements = FrozenMap[str, NamedPlacement]
Side = Literal["in", "out"]
TP = "tp"
EP = "ep"


def _names(values: tuple[str, ...] | None) -> tuple[str, ...]:
    return values or ()


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedTransition:
    """One named input or output of a boundary, as the plan declares it (unresolved).

    Resolving it over mesh axes and lowering it to collectives is
    :mod:`hpcodegen.plan.classify`'s job; this is what the meta says.
    """

    side: Side
    """``"in"`` for an argument of the forward, ``"out"`` for a return value."""
    name: str
    """The input or output name, e.g. ``"hidden_states"`` or ``"output"``."""
    src: NamedPlacement
    """Placement as it arrives (input) or as the module computes it (output),
    e.g. ``{"tp": Shard(1)}``; ``{}`` when the meta names it only on the other side."""
    dst: NamedPlacement
    """Placement required inside (input) or handed downstream (output), e.g. ``{"tp": R}``."""

    @property
    def changes(self) -> bool:
        """Some axis differs between ``src`` and ``dst`` (a missing axis reads ``R``)."""
        axes = set(self.src) | set(self.dst)
        return any(self.src.get(a, REPLICATE) != self.dst.get(a, REPLICATE) for a in axes)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanEntry:
    """One ``param_plan`` entry: a boundary module, or a parameter-only module."""

    fqn: str
    """The module's FQN (the entry's key), e.g. ``"model.layers.0.self_attn"``; ``""`` is
    the root module."""
    params: NamedPlacements | None = None
    """``params``: parameter path relative to the module (``""``: the module itself) ->
    its placement, e.g. ``{"q_proj.weight": {"tp": Shard(0)}}``."""
    in_src: NamedPlacements | None = None
    """``in_src``: each input's placement as it arrives,
    e.g. ``{"hidden_states": {"tp": Shard(1)}}``."""
    in_dst: NamedPlacements | None = None
    """``in_dst``: the placement each input is redistributed to before the module computes."""
    out_src: NamedPlacements | None = None
    """``out_src``: each output's placement as the module computes it, e.g. ``P(sum)``."""
    out_dst: NamedPlacements | None = None
    """``out_dst``: the placement each output leaves the boundary with."""
    out_names: tuple[str, ...] | None = None
    """``out_names``: output names in return order, e.g. ``("output", "attn_weights")``."""
    tp_divide_attrs: tuple[str, ...] | None = None
    """``tp_divide_attrs``: integer attributes divided by tp on each rank (head counts),
    e.g. ``("num_heads",)``."""
    is_boundary: bool | None = None
    """``is_boundary``: the declared flag; :attr:`boundary` is the effective reading."""
    region_dispatch: bool | None = None
    """``region_dispatch``: ``False`` declares a black-box local region (reference system)."""
    deferred_bias_params: tuple[str, ...] | None = None
    """``deferred_bias_params``: biases added once after the output's reduction,
    e.g. ``("o_proj.bias",)``."""
    tp_rank0_params: tuple[str, ...] | None = None
    """``tp_rank0_params`` (hpcodegen): replicated parameters only tp rank 0 applies inside
    a tp-split compute (GPT-OSS ``down_proj_bias``); their gradient is partial over tp."""
    partial_grad_params: tuple[str, ...] | None = None
    """``partial_grad_params`` (hpcodegen): replicated parameters whose gradient is partial
    over tp (SP norms, Qwen3 ``q_norm``), all-reduced by the runtime."""
    no_grad_inputs: tuple[str, ...] | None = None
    """``no_grad_inputs`` (hpcodegen): inputs carrying no gradient (integer expert indices),
    whose transitions run no backward collective, e.g. ``("top_k_index",)``."""
    extra: FrozenMap[str, Any] = EMPTY
    """Keys no field models, verbatim (frozen JSON)."""

    @property
    def boundary(self) -> bool:
        """``is_boundary`` when declared, else whether any in/out placement is declared."""
        if self.is_boundary is not None:
            return self.is_boundary
        return any((self.in_src, self.in_dst, self.out_src, self.out_dst))

    @property
    def output_names(self) -> tuple[str, ...]:
        """Return-order output names: ``out_names``, else the ``out_src`` key order."""
        return self.out_names or tuple(self.out_src or ())

    def output_index(self, name: str) -> int:
        """Position of output ``name`` in the forward's tuple; an unknown name is 0."""
        names = self.output_names
        return names.index(name) if name in names else 0

    def transitions(self, side: Side) -> tuple[PlannedTransition, ...]:
        """The inputs (``"in"``) or outputs (``"out"``), by sorted name; a name declared on
        one side of the pair only has ``{}`` (all ``R``) on the other."""
        src = (self.in_src if side == "in" else self.out_src) or EMPTY
        dst = (self.in_dst if side == "in" else self.out_dst) or EMPTY
        return tuple(PlannedTransition(side=side, name=n, src=src.get(n, EMPTY),
                                       dst=dst.get(n, EMPTY))
                     for n in sorted(set(src) | set(dst)))

    def passes_through(self) -> bool:
        """Every declared input and output keeps its placement (``src == dst``, the same
        names on both sides): the boundary moves no data, whatever the placements."""
        for src, dst in ((self.in_src, self.in_dst), (self.out_src, self.out_dst)):
            if dict(src or EMPTY) != dict(dst or EMPTY):
                return False
        return True

    def first_output_dst(self) -> NamedPlacement | None:
        """The ``out_dst`` placement of the forward's first return value, if declared."""
        dst = self.out_dst or EMPTY
        first = [n for n in sorted(dst) if self.output_index(n) == 0]
        return dst[first[0]] if first else None

    def partial_deferred_biases(self) -> tuple[str, ...]:
        """The ``deferred_bias_params`` whose gradient is partial over tp.

        A deferred bias is added once to the first output after its output transition;
        when that output leaves sharded on tp (an SP reduce_scatter), each rank adds it to
        its shard only, so its gradient is the rank's share (decisions.md item 6).
        """
        if not self.deferred_bias_params:  # the common case: no output walk
            return ()
        first = self.first_output_dst()
        sharded = first is not None and isinstance(first.get(TP), Shard)
        return _names(self.deferred_bias_params) if sharded else ()

    def effective_partial_grad_params(self) -> tuple[str, ...]:
        """The parameters whose gradient the runtime all-reduces over tp: the declared
        ``partial_grad_params``, then the :meth:`partial_deferred_biases` and
        ``tp_rank0_params`` not declared (another generator may omit the derived ones)."""
        declared = _names(self.partial_grad_params)
        if not self.deferred_bias_params and not self.tp_rank0_params:
            return declared  # nothing derived (most entries): no walk
        derived = self.partial_deferred_biases() + _names(self.tp_rank0_params)
        return declared + tuple(dict.fromkeys(n for n in derived if n not in declared))

    def splits_compute(self) -> bool:
        """The compute is split over tp: a tp-sharded parameter or a tp-Partial output.
        Then every replicated input's gradient is partial over tp inside it."""
        if any(is_shard(named[TP]) for named in (self.params or EMPTY).values() if TP in named):
            return True
        return self.partial_output()

    def partial_output(self) -> bool:
        """Some output is computed partial over tp (``out_src`` ``P(op)``)."""
        return any(isinstance(named.get(TP), Partial) for named in (self.out_src or EMPTY).values())

    def output_sequence_sharded(self) -> bool:
        """Some output leaves sharded on tp along the sequence dim (``S(1)``)."""
        return any(named.get(TP) == Shard(1) for named in (self.out_dst or EMPTY).values())

    def is_vocab_sharded_head(self) -> bool:
        """A boundary whose weight is ``S(0)`` on tp and whose first output leaves ``S(-1)``
        on tp (``out_dst``, else ``out_src``): the logits stay sharded on the vocabulary."""
        if not self.boundary:
            return False
        names = self.output_names
        outs = self.out_dst or self.out_src or EMPTY
        out = outs.get(names[0]) if names else None
        weight = (self.params or EMPTY).get("weight")
        return (out is not None and out.get(TP) == Shard(-1)
                and weight is not None and weight.get(TP) == Shard(0))

    def takes_sharded_input(self) -> bool:
        """A boundary with an input arriving ``S(-1)`` on tp (the second half of a split MLP)."""
        return self.boundary and any(named.get(TP) == Shard(-1)
                                     for named in (self.in_src or EMPTY).values())


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedParam:
    """One planned parameter (a derived view: :meth:`Plan.parameters`)."""

    fqn: str
    """The parameter's full FQN, e.g. ``"model.layers.0.self_attn.q_proj.weight"``."""
    entry: str
    """The FQN of the entry that plans it, e.g. ``"model.layers.0.self_attn"``."""
    name: str
    """Its path relative to the entry, e.g. ``"q_proj.weight"`` (``""``: the module itself)."""
    placements: NamedPlacement
    """``{axis: placement}``, e.g. ``{"tp": Shard(0)}``."""

    @property
    def is_expert(self) -> bool:
        """An expert parameter (its placement has an ``ep`` key): it lives on the expert mesh."""
        return EP in self.placements


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """A callable by ``_target_`` plus keyword arguments: ``{"_target_": ..., **kwargs}``."""

    path: str
    """The registered target name or dotted path, e.g. ``"pkg.moe.local_compute"``."""
    kwargs: FrozenMap[str, Any] = EMPTY
    """The other keys, passed to the factory, e.g. ``{"use_grouped_gemm": True}``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Injection:
    """One ``injections`` record: the modules it matches and the callables bound there."""

    match: str | tuple[str, ...]
    """``match``: one module FQN, or several (a list in the JSON fans out to each)."""
    inner_wrapper: Target | str | None = None
    """``inner_wrapper``: a factory wrapping the module's inner computation, a
    :class:`Target` or a registered name such as ``"sdpa_hf"``."""
    inner_target: str | None = None
    """``inner_target``: the child the wrapper's result replaces (``"self"``: none)."""
    inner_out_src: Any = None
    """``inner_out_src``: placements of the wrapped computation's outputs (frozen JSON:
    ``"first_input"``, a named placement or one per output; informational here)."""
    inner_in_src: NamedPlacements | None = None
    """``inner_in_src``: the wrapped attention's K/V as its kernel gets them (context
    parallelism, :mod:`hpcodegen.plan.cp`), e.g. ``{"key": {"cp": Shard(2)}, ...}``."""
    inner_in_dst: NamedPlacements | None = None
    """``inner_in_dst``: the K/V placements the kernel needs, e.g. ``{"key": {"cp": R}}``
    (all-gathered over cp forward, the gradient reduce-scattered back)."""
    inner_out_dst: Any = None
    """``inner_out_dst``: the output placements the module needs back from the wrapped
    kernel (Ulysses: ``{"output": {"cp": S(1)}}`` from ``inner_out_src``'s ``S(2)``)."""
    cp_heads: Any = None
    """``cp_heads``: the unsharded query / kv head counts a Ulysses record was checked on
    (``{"query": 32, "key_value": 8}``; frozen JSON)."""
    local_compute_fn: Target | None = None
    """``local_compute_fn``: a factory whose result the region form calls as the compute."""
    ep_stack: FrozenMap[str, tuple[str, ...]] | None = None
    """``ep_stack``: stacked parameter path -> the per-expert paths stacked into it."""
    ep_size: int | None = None
    """``ep_size``: the expert-parallel size the experts were stacked for, e.g. ``4``."""
    extra: FrozenMap[str, Any] = EMPTY
    """Keys no field models, verbatim."""

    @property
    def fqns(self) -> tuple[str, ...]:
        """The matched module FQNs, a single ``match`` as a 1-tuple."""
        return (self.match,) if isinstance(self.match, str) else self.match

    @property
    def targets(self) -> dict[str, Target | str]:
        """``{"inner_wrapper" | "local_compute_fn": target}`` for the callables it names."""
        out: dict[str, Target | str] = {}
        if self.inner_wrapper is not None:
            out["inner_wrapper"] = self.inner_wrapper
        if self.local_compute_fn is not None:
            out["local_compute_fn"] = self.local_compute_fn
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelDims:
    """``parallel_dims``: the mesh sizes the plan was frozen for, and its flags."""

    sizes: FrozenMap[str, int] = EMPTY
    """Every ``<axis>_size`` integer by axis, e.g. ``{"dp": 1, "tp": 2, "cp": 1}``."""
    sequence_parallel: bool | None = None
    """``sequence_parallel``: activations between boundaries are sequence-sharded over tp."""
    loss_parallel: bool | None = None
    """``loss_parallel``: the logits stay vocab-sharded for a loss-parallel cross entropy."""
    cp_layout: str | None = None
    """``cp_layout``: which sequence positions a cp rank holds, ``"headtail"`` or
    ``"contiguous"`` (None: absent, read as contiguous; :mod:`hpcodegen.plan.cp`)."""
    extra: FrozenMap[str, Any] = EMPTY
    """Keys no field models, verbatim."""

    def size(self, axis: str) -> int:
        """The frozen size of ``axis`` (1 when not recorded)."""
        return self.sizes.get(axis, 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """An artifact's frozen plan: what to shard, where the boundaries are, what to inject.

    Build it with :func:`hpcodegen.plan.codec.plan_from_meta` (the loader does, once);
    :func:`hpcodegen.plan.codec.plan_to_meta` gives the meta back, equal to the input.

    Example::

        plan = load_checked_meta("examples/llama_tp2").plan
        plan.axes                                           # ("tp",)
        plan.entries["lm_head"].params["weight"]["tp"]      # Shard(dim=0)
    """

    param_plan: FrozenMap[str, PlanEntry] | None = None
    """``param_plan``: module FQN -> :class:`PlanEntry`, in the meta's order."""
    injections: tuple[Injection, ...] | None = None
    """``injections``: the injection records, in the meta's order."""
    parallel_dims: ParallelDims | None = None
    """``parallel_dims``: frozen axis sizes and flags."""
    mesh_dim_names: tuple[str, ...] | None = None
    """``mesh_dim_names``: the plan's axes in order, e.g. ``("cp", "tp")``."""
    tied_pairs: tuple[tuple[str, str], ...] | None = None
    """``tied_pairs``: ``(source, tied)`` parameter FQNs sharing storage, e.g.
    ``(("model.embed_tokens.weight", "lm_head.weight"),)``."""
    special_handlers: FrozenMap[str, str] | None = None
    """``special_handlers``: module FQN or class -> handler name (entry-point plug-ins)."""
    boundary_classes: FrozenMap[str, str] | None = None
    """``boundary_classes``: boundary FQN -> its class name in the generated file."""
    frozen_sharded_params: tuple[str, ...] | None = None
    """``frozen_sharded_params``: full FQNs of the parameters the plan shards."""
    entrypoints: FrozenMap[str, str] | None = None
    """``entrypoints``: named functions of the generated module, e.g.
    ``{"parallelize": "hp_parallelize"}`` (recorded, never called by hpcodegen)."""
    module_overrides: tuple[Any, ...] | None = None
    """``module_overrides``: modules the reference system replaces (frozen JSON records)."""
    pipeline: Pipeline | None = None
    """``pipeline`` (hpcodegen): the frozen pipeline-parallel split, schedule and action
    list (:mod:`hpcodegen.plan.pipeline`); None: not pipelined."""
    provenance: Provenance = NO_PROVENANCE
    """Signature, source, output digests and the other bookkeeping keys."""
    extra: FrozenMap[str, Any] = EMPTY
    """Top-level keys no field models (another generator's), verbatim."""

    @property
    def entries(self) -> FrozenMap[str, PlanEntry]:
        """``param_plan``, empty when absent."""
        return self.param_plan or EMPTY

    @property
    def dims(self) -> ParallelDims:
        """``parallel_dims``, empty when absent."""
        return self.parallel_dims or ParallelDims()

    @property
    def axes(self) -> tuple[str, ...]:
        """The plan's mesh axes: ``mesh_dim_names``, else the ``cp``, ``tp`` sizes > 1."""
        if self.mesh_dim_names is not None:
            return self.mesh_dim_names
        return tuple(a for a in ("cp", "tp") if self.dims.size(a) > 1)

    def parameters(self) -> tuple[PlannedParam, ...]:
        """Every planned parameter, entry by entry in the meta's order."""
        return tuple(PlannedParam(fqn=_join(fqn, rel), entry=fqn, name=rel, placements=named)
                     for fqn, entry in self.entries.items()
                     for rel, named in (entry.params or EMPTY).items())

    def injections_by_fqn(self) -> dict[str, Injection]:
        """Module FQN -> the injection record matching it (a later record wins)."""
        return {fqn: record for record in self.injections or () for fqn in record.fqns}

    def vocab_sharded_heads(self) -> list[str]:
        """With ``parallel_dims.loss_parallel``: the boundaries leaving the logits
        vocab-sharded (:meth:`PlanEntry.is_vocab_sharded_head`), less those a sibling
        boundary (same parent module) takes a ``S(-1)`` input from (OPT's ``fc1`` feeding
        ``fc2``). Empty without the flag."""
        if self.dims.loss_parallel is not True:
            return []
        consumers = {_parent(f) for f, e in self.entries.items() if e.takes_sharded_input()}
        return sorted(f for f, e in self.entries.items()
                      if e.is_vocab_sharded_head() and _parent(f) not in consumers)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


def _parent(fqn: str) -> str:
    return fqn.rpartition(".")[0]
