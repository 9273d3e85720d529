"""Lifting per-Linear HF styles to module boundaries (lazy torch: works on a meta model).

HF shards each Linear and hooks its forward; we instead declare one boundary per region:
the parent of a colwise group (q/k/v, gate/up) and a rowwise closer (o_proj, down_proj)
becomes ONE entry whose input is gathered once and whose partial output is reduced once.
The vocab-parallel embedding, ``lm_head`` and the norms get their own entries. With
sequence parallelism (``sp``) activations between boundaries are sharded on the sequence
dim (``S(1)``): region inputs are all-gathered and region outputs reduce-scattered.

What a module's class says is read from :mod:`.module_facts`, the transitions and the
lifter-free entries come from :mod:`.entries`, and the parameters no rule names are
planned afterwards by :mod:`.unplanned`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.layouts.entries import (
    FIRST,
    LAST,
    PARTIAL,
    PER_TOKEN_EMBEDDING,
    SEQ,
    embedding_transitions,
    not_lookup_only,
    set_transitions,
    sharded_norm_entry,
    tp,
)
from hpcodegen.generate.seeds.module_facts import (
    call_model,
    direct_params,
    first_arg,
    fused_blocks,
    head_count_attrs,
    holds_weight,
    is_lookup_embedding,
    linear_dims,
)
from hpcodegen.generate.sources.globs import parent_of, relative_to
from hpcodegen.generate.sources.hf_plan import Assignment
from hpcodegen.generate.sources.styles import Kind, param_shard, shard
from hpcodegen.placement import REPLICATE, Placement, Shard
from hpcodegen.plan.draft import DraftEntry, DraftPlan
from hpcodegen.tracer.norms import is_norm

REGION_KINDS = (Kind.COLWISE, Kind.ROWWISE)
ABSORBED = (Kind.REPLICATE, Kind.REPLICATE_GRAD, Kind.LOCAL_COLWISE, Kind.LOCAL_ROWWISE)


#: transformers' name of a fused gate|up expert weight (Llama-4's ``down_proj`` is colwise
#: too, [E, in, out] under bmm, and is not what its forward chunks)
_FUSED_NAME = re.compile(r"gate_?up|up_?gate")
#: a parameter path -> its placement on each axis, while an entry is assembled
Params = dict[str, dict[str, Placement]]
#: the kinds :meth:`Lifter.standalone_entry` places on their own
_STANDALONE = frozenset({Kind.COLWISE_GATHER, Kind.ROWWISE_SPLIT, Kind.EMBED_VOCAB,
                         Kind.EMBED_HIDDEN, Kind.NORM, Kind.REPLICATE, Kind.REPLICATE_GRAD})


class Lifter:
    """Builds ``param_plan`` entries from expanded HF assignments (one instance per model),
    into a :class:`~hpcodegen.plan.draft.DraftPlan` with placement objects."""

    def __init__(self, model: Any, assignments: Mapping[str, Assignment], sp: bool,
                 loss_parallel: bool = False) -> None:
        self.model = model
        self.modules: dict[str, Any] = dict(model.named_modules())
        self.assign = dict(assignments)
        self.sp = sp
        head = call_model(model, "get_output_embeddings")
        #: with loss parallelism the output head's logits stay vocab-sharded (no gather)
        self.sharded_head = next((f for f, m in self.modules.items() if m is head), None) \
            if loss_parallel and head is not None else None
        self.plan = DraftPlan()
        #: ``experts`` modules (HF ``moe_tp_experts``): regions over all their inputs
        self.moe_experts = {a.fqn for a in self.assign.values() if a.kind is Kind.MOE_EXPERTS}

    # -- regions ---------------------------------------------------------------------------
    def region_parents(self) -> dict[str, list[Assignment]]:
        """Parents of colwise/rowwise Linears, each with its shard children.

        A ``rowwise_split_input`` child closes a region only where its parent has colwise
        children (its input is then already sharded); beside gathered colwise siblings
        (HF's fused q|k|v or gate|up: ``colwise_gather_output``) it is its own boundary.
        """
        groups: dict[str, list[Assignment]] = {}
        for a in self.assign.values():
            if a.kind in REGION_KINDS:
                groups.setdefault(parent_of(a.fqn), []).append(a)
        for a in self.assign.values():
            if a.kind is Kind.ROWWISE_SPLIT and parent_of(a.fqn) in groups:
                groups[parent_of(a.fqn)].append(replace(a, kind=Kind.ROWWISE))
        for parent, members in groups.items():
            kinds = {a.kind for a in members}
            if kinds != set(REGION_KINDS) and parent not in self.moe_experts:
                a = members[0]
                missing = "rowwise" if a.kind is Kind.COLWISE else "colwise"
                raise PlanError([error(
                    "generate.unpaired_style", a.fqn,
                    f"HF plan rule {a.rule!r} ({a.style}): {parent or '<root>'} has no {missing} "
                    "child to close the region, so no boundary can be lifted",
                    hint="declare the boundary with a recipe rule (--recipe)")])
            rows = sorted(a.fqn for a in members if a.kind is Kind.ROWWISE)
            if len(rows) > 1 and parent not in self.moe_experts:
                # the region reduces its output once; a second rowwise child's partial
                # result is consumed inside the forward before any reduction (Doge's
                # dt_proj feeding a per-head mask), where a sum of rank-local partials is
                # not the unsharded value and its head dim is not split with the heads
                raise PlanError([error(
                    "generate.rowwise_inside_region", rows[0],
                    f"{parent or '<root>'} has {len(rows)} rowwise children "
                    f"({', '.join(r.rsplit('.', 1)[-1] for r in rows)}): its region reduces "
                    "only the forward's output once, so all but one of them would hand "
                    "their partial (unreduced) output to the rest of the forward; not exact",
                    hint="replicate all but the output projection with a recipe rule")])
            for a in members:
                self.assign[a.fqn] = a
        return groups

    def _shard_params(self, entry_fqn: str, a: Assignment, out: Params, deferred: list,
                      divide: list | None = None) -> None:
        rel = relative_to(a.fqn, entry_fqn)
        if a.param and entry_fqn in self.moe_experts \
                and self.model.get_parameter(a.fqn).dim() == 2:
            # a per-expert vector [E, n] (GPT-OSS's biases): colwise splits n with its
            # projection's output; rowwise is the bias of a row-split projection, added to
            # each rank's partial output: whole, applied by tp rank 0 only (counted once)
            if a.kind in (Kind.COLWISE, Kind.LOCAL_COLWISE):
                out[rel] = tp(shard(1, a.factor))
            else:
                out[rel] = tp(REPLICATE)
                deferred.append(rel)
            return
        if a.param:  # a rule on the parameter itself: a packed expert weight [E, out, in]
            placement, rowwise_bias = param_shard(a.kind, self.model.get_parameter(a.fqn).dim(),
                                                  self._param_factor(entry_fqn, a))
            if rowwise_bias:
                raise PlanError([error(
                    "generate.rowwise_param_bias", a.fqn,
                    f"HF plan rule {a.rule!r} ({a.style}) shards a 1-D parameter rowwise; "
                    "it would be added once per rank", hint="place it with a recipe rule")])
            out[rel] = tp(placement)
            return
        module = self.modules[a.fqn]
        col = a.kind in (Kind.COLWISE, Kind.LOCAL_COLWISE, Kind.COLWISE_GATHER)
        out_dim, in_dim = linear_dims(module)
        for pname in direct_params(module):
            key = f"{rel}.{pname}" if rel else pname
            if pname == "bias" and not col:
                out[key] = tp(REPLICATE)
                deferred.append(key)
            elif pname == "bias":
                out[key] = tp(shard(0, a.factor))
            else:
                out[key] = tp(shard(out_dim if col else in_dim, a.factor))
        if col and divide is not None and isinstance(getattr(module, "nf", None), int):
            divide.append(f"{rel}.nf" if rel else "nf")  # Conv1D sizes its output by nf

    def _param_factor(self, entry_fqn: str, a: Assignment) -> int:
        """The strided factor of a colwise rule on an expert parameter.

        A plain ``colwise`` on the fused gate|up weight of an ``experts`` module whose forward
        cuts a projection's output into ``k`` blocks (a fused ``gate_up_proj`` with
        ``.chunk(2, dim=-1)``: Inkling's HF plan) is the packed ``SS(dim,k)``: a contiguous
        shard would hand rank 0 the gate and rank 1 the up, and each rank's chunk would
        pair the wrong halves (measured: logits off by 1e-2)."""
        if a.factor != 1 or a.kind is not Kind.COLWISE or entry_fqn not in self.moe_experts \
                or not _FUSED_NAME.search(a.fqn.rpartition(".")[2]):
            return a.factor
        return fused_blocks(self.modules[entry_fqn])

    def _absorb(self, entry_fqn: str, params: Params, deferred: list, partial: list,
                divide: list) -> None:
        """Put every assignment inside ``entry_fqn`` into its params."""
        for a in self.assign.values():
            rel = relative_to(a.fqn, entry_fqn)
            if not rel:
                continue
            if a.kind in (Kind.COLWISE, Kind.ROWWISE, Kind.LOCAL_COLWISE, Kind.LOCAL_ROWWISE):
                self._shard_params(entry_fqn, a, params, deferred, divide)
            elif a.kind in (Kind.REPLICATE, Kind.REPLICATE_GRAD, Kind.MLA_KV_A):
                # a rule on a parameter itself names just it (GPT-NeoX Japanese's dense_bias)
                names = [rel] if a.param else [
                    f"{rel}.{pname}" for pname in direct_params(self.modules[a.fqn])]
                for name in names:
                    params[name] = tp(REPLICATE)
                    if a.kind is not Kind.REPLICATE:
                        partial.append(name)
            elif a.kind in (Kind.LOCAL_PARAMS, Kind.SHARDED_NORM):
                continue  # a region's forward already runs on local shards; a split norm
                # is a boundary of its own (sharded_norm_entry)
            else:
                raise PlanError([error(
                    "generate.nested_boundary", a.fqn,
                    f"HF plan rule {a.rule!r} ({a.style}) declares a boundary inside the "
                    f"region {entry_fqn}", hint="override one of them with a recipe rule")])

    def region_entry(self, fqn: str) -> None:
        """One region boundary: gather the input once, reduce the partial output once."""
        params: Params = {}
        deferred: list[str] = []
        partial: list[str] = []
        divide: list[str] = []
        self._absorb(fqn, params, deferred, partial, divide)
        module = self.modules[fqn]
        entry = self.plan.reset(fqn)
        if fqn in self.moe_experts:
            from hpcodegen.generate.layouts.moe_entry import moe_entry

            moe_entry(entry, module, params, self.sp, once=deferred)
            return
        seq = SEQ if self.sp else REPLICATE
        entry.set_placements("params", params)
        set_transitions(entry, first_arg(module), seq, REPLICATE, PARTIAL, seq)
        a = self.assign.get(fqn)
        if a is not None and a.kind is Kind.REDUCE_OUTPUT:
            self._declare_extra_inputs(fqn, module, entry)
        entry.set("tp_divide_attrs", tuple(sorted(set(head_count_attrs(module)) | set(divide))))
        if deferred:
            entry.set("deferred_bias_params", tuple(sorted(deferred)))
            # added after the SP reduce_scatter: each rank sees its sequence slice
            partial.extend(entry.view().partial_deferred_biases())
        if partial:
            entry.set("partial_grad_params", tuple(sorted(set(partial))))

    def _declare_extra_inputs(self, fqn: str, module: Any, entry: DraftEntry) -> None:
        """Declare every further required input of an ``all_reduce`` region replicated.

        Its forward computes on tp shards, so a replicated input it multiplies in (Inkling's
        shared experts' routing ``gammas``) gets a partial gradient on each rank; declared,
        the classifier's rule all-reduces it in the backward (left out, the router upstream
        got one rank's partial gradient). Under sp such an input would arrive as a sequence
        slice beside the gathered first input: refused."""
        first = first_arg(module)
        params = list(inspect.signature(type(module).forward).parameters.values())[1:]
        extra = [p.name for p in params if p.name != first and p.default is p.empty
                 and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if extra and self.sp:
            raise PlanError([error(
                "generate.region_inputs_sp", fqn,
                f"{type(module).__name__}.forward takes further inputs ({', '.join(extra)}) "
                "besides the gathered first one; with sequence parallelism (--sp) they would "
                "arrive as this rank's slice of the sequence", hint="generate without --sp")])
        for name in extra:
            entry.place("in_src", name, tp(REPLICATE))
            entry.place("in_dst", name, tp(REPLICATE))

    # -- standalone entries ----------------------------------------------------------------
    def standalone_entry(self, a: Assignment, seq_sharded: bool = True) -> None:
        """The entry of a module whose own style says what it does (``seq_sharded``: its
        activations are sequence-sharded with ``sp``; not inside a gathering parent)."""
        module = self.modules[a.fqn]
        names = direct_params(module)
        seq: Placement = SEQ if self.sp and seq_sharded else REPLICATE
        if a.kind not in _STANDALONE and a.rule != PER_TOKEN_EMBEDDING:
            what = ("has no colwise/rowwise children of its own, so no region runs its "
                    "forward on local shards" if a.kind is Kind.LOCAL_PARAMS else
                    "needs an enclosing region (a colwise/rowwise parent or a gather/"
                    "all_reduce module)")
            raise PlanError([error(
                "generate.unsupported_style", a.fqn,
                f"HF plan rule {a.rule!r}: style {a.style!r} on {a.fqn} {what}",
                hint="declare the boundary with a recipe rule (--recipe)")])
        entry = self.plan.reset(a.fqn)
        whole = {p: tp(REPLICATE) for p in names}
        if a.kind is Kind.COLWISE_GATHER:
            params: Params = {}
            divide: list[str] = []
            self._shard_params(a.fqn, a, params, [], divide)
            out = LAST if a.fqn == self.sharded_head else REPLICATE
            entry.set_placements("params", params)
            set_transitions(entry, first_arg(module), seq, REPLICATE, LAST, out)
            if divide:
                entry.set("tp_divide_attrs", tuple(divide))
        elif a.kind is Kind.ROWWISE_SPLIT:
            params, deferred = {}, []
            self._shard_params(a.fqn, a, params, deferred)
            entry.set_placements("params", params)
            set_transitions(entry, first_arg(module), REPLICATE, LAST, PARTIAL, seq)
            if deferred:
                entry.set("deferred_bias_params", tuple(sorted(deferred)))
                biases = entry.view().partial_deferred_biases()
                if biases:
                    entry.set("partial_grad_params", tuple(sorted(biases)))
        elif a.kind is Kind.EMBED_VOCAB and not_lookup_only(module) and not self.sp:
            # transformers' default ``embedding_rowwise`` on an embedding that does more
            # than the lookup: kept whole, the exact plan (under sp it is refused below:
            # its submodules would see the whole sequence while planned on a slice)
            entry.set_placements("params", whole)
            entry.set("is_boundary", False)
        elif a.kind is Kind.EMBED_VOCAB:
            entry.set_placements("params", {p: tp(FIRST) for p in names})
            embedding_transitions(entry, module, self.sp and seq_sharded)
        elif a.kind is Kind.EMBED_HIDDEN:
            entry.set_placements("params", {p: tp(Shard(1)) for p in names})
            set_transitions(entry, first_arg(module), REPLICATE, REPLICATE, LAST, seq)
        elif a.kind is Kind.NORM:
            entry.set_placements("params", whole)
            set_transitions(entry, first_arg(module), seq, seq, seq, seq)
            if seq == SEQ and names:  # each rank normalises its slice of the sequence
                entry.set("partial_grad_params", tuple(sorted(names)))
        elif a.rule == PER_TOKEN_EMBEDDING:
            # computed whole on every rank (replicated weight, full gradient), then this
            # rank's slice of the sequence taken: the output's backward all-gathers
            entry.set_placements("params", whole)
            set_transitions(entry, first_arg(module), REPLICATE, REPLICATE, REPLICATE, seq)
        else:  # REPLICATE, REPLICATE_GRAD
            entry.set_placements("params", whole)
            entry.set("is_boundary", False)
            if a.kind is Kind.REPLICATE_GRAD and names:
                entry.set("partial_grad_params", tuple(sorted(names)))

    # -- the whole plan --------------------------------------------------------------------
    def _defaults(self) -> list[Assignment]:
        """Embedding, lm_head and norms the HF plan leaves out (5.x lists no norms)."""
        by_id = {id(m): fqn for fqn, m in self.modules.items()}
        extra: list[Assignment] = []
        # only a module holding the weight itself: a ModuleList of per-codebook heads
        # (MusicGen) has no forward of its own to place
        emb = call_model(self.model, "get_input_embeddings")
        if emb is not None and by_id.get(id(emb)) not in self.assign and holds_weight(emb):
            extra.append(Assignment(by_id[id(emb)], Kind.EMBED_VOCAB, 1,
                                    "embedding_rowwise", "<input embeddings>"))
        head = call_model(self.model, "get_output_embeddings")
        if head is not None and by_id.get(id(head)) not in self.assign \
                and holds_weight(head):
            extra.append(Assignment(by_id[id(head)], Kind.COLWISE_GATHER, 1,
                                    "colwise_gather_output", "<output embeddings>"))
        for fqn, module in self.modules.items():
            if fqn not in self.assign and is_norm(module):
                extra.append(Assignment(fqn, Kind.NORM, 1, "sequence_parallel", "<norm>"))
        known = {a.fqn for a in extra} | set(self.assign)
        for fqn, module in self.modules.items():
            if self.sp and fqn not in known and is_lookup_embedding(module) \
                    and direct_params(module):
                extra.append(Assignment(fqn, Kind.REPLICATE, 1, "<per-token embedding>",
                                        PER_TOKEN_EMBEDDING))
        return extra

    def run(self) -> DraftPlan:
        """Lift every assignment (and the defaults) into ``param_plan`` entries."""
        regions = list(self.region_parents())
        regions += [a.fqn for a in self.assign.values()
                    if a.kind in (Kind.REDUCE_OUTPUT, Kind.MOE_EXPERTS) and a.fqn not in regions]
        for fqn in regions:
            self.region_entry(fqn)
        for a in self.assign.values():
            if a.kind is Kind.SHARDED_NORM:
                sharded_norm_entry(self.plan.reset(a.fqn), self.modules[a.fqn])

        def inside(fqn: str) -> bool:
            return any(relative_to(fqn, r) not in (None, "") for r in regions)

        pending = [a for a in self.assign.values() if a.fqn not in self.plan and not a.param]
        pending += [a for a in self._defaults() if not inside(a.fqn)]
        gathered = self._sp_gathered_parents(pending, inside)
        for a in pending:
            if not inside(a.fqn):
                self.standalone_entry(a, parent_of(a.fqn) not in gathered)
        return self.plan

    def _sp_gathered_parents(self, pending: list[Assignment], inside: Any) -> set[str]:
        """With ``sp``: the parents of a ``rowwise_split_input`` Linear beside gathered
        siblings (Phi-3's attention) become boundaries that gather the sequence on entry
        (``S(1)->R``) and keep their slice on exit (``R->S(1)``): their forward reshapes by
        the sequence length it sees, so it must see all of it. Their children then take
        and give replicated activations."""
        if not self.sp:
            return set()
        parents = {parent_of(a.fqn) for a in pending if a.kind is Kind.ROWWISE_SPLIT}
        parents = {p for p in parents if p and p not in self.plan and not inside(p)}
        for fqn in parents:
            entry = self.plan.reset(fqn)
            entry.set_placements("params", {})
            set_transitions(entry, first_arg(self.modules[fqn]), SEQ, REPLICATE, REPLICATE, SEQ)
        return parents


def lift_plan(model: Any, assignments: Mapping[str, Assignment], sp: bool,
              loss_parallel: bool = False) -> DraftPlan:
    """``param_plan`` entries for a meta-device model from its expanded HF assignments;
    with ``loss_parallel`` the output head keeps its logits sharded on the vocabulary."""
    return Lifter(model, assignments, sp, loss_parallel).run()


