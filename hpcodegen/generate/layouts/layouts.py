"""Megatron's layouts where the HF plan has none or a gathering one (lazy torch: a meta model).

transformers' TP plans are written for inference and sometimes keep a whole module on
every rank: a missing rule replicates it, and ``colwise_gather_output`` (with its
``rowwise_split_input`` partner) all-gathers a projection's output so that the rest of
the forward runs unsplit. Megatron splits heads instead. Applied to the expanded HF
assignments, before the package rules and recipes (which still win), these rules give
the split layout wherever it is exact, and name the reason where it is not:

* **MLA** (DeepSeek-V2/V3, MiniCPM3, ...): an attention holding ``kv_a_proj_with_mqa``,
  ``kv_b_proj`` and ``o_proj`` that no rule names gets DeepSeek-V2's plan: the query and
  key/value up-projections (``q_proj`` or ``q_b_proj``, ``kv_b_proj``) colwise, ``o_proj``
  rowwise, ``kv_a_proj_with_mqa`` replicated inside the region (its gradient partial); the
  down-projections and their norms stay replicated there, as in Megatron.
* **a fused projection** under ``colwise_gather_output`` beside a ``rowwise_split_input``:
  when the parent's forward cuts its output into ``k`` equal blocks on the last dim
  (``gate, up = x.chunk(2, dim=-1)``: Phi-3, GLM-4) it is ``packed_colwise`` with ``k``
  blocks and its partner ``rowwise``: each rank holds its share of every block. A fused
  ``q|k|v`` (Phi-3's ``qkv_proj``) is three blocks when the query and key/value heads are
  as many (the rank's query heads then meet their own key/value heads); the forward's
  head counts read from the config are divided per rank.
* anything else stays as transformers planned it, with the reason recorded: generate
  prints it with the cost against Megatron's layout (:mod:`hpcodegen.plan.megatron`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hpcodegen.generate.seeds.module_facts import fused_blocks
from hpcodegen.generate.seeds.seeds import (
    SEED_RULE,
    block_assignments,
    children,
    config_value,
    head_counts,
    is_linear,
)
from hpcodegen.generate.sources.globs import parent_of
from hpcodegen.generate.sources.hf_plan import Assignment
from hpcodegen.generate.sources.styles import Kind
from hpcodegen.plan.draft import DraftPlan

if TYPE_CHECKING:
    from hpcodegen.tracer.dataflow import Flow

#: the model's traced forward, traced on first ask (None: it does not run on meta)
FlowOf = Callable[[], "Flow | None"]

#: MLA attention children: required, and the styles DeepSeek-V2's plan gives them
MLA_REQUIRED = ("kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
MLA_STYLES = {"q_proj": (Kind.COLWISE, "colwise"), "q_b_proj": (Kind.COLWISE, "colwise"),
              "kv_a_proj_with_mqa": (Kind.MLA_KV_A, "mla_kv_a_proj"),
              "kv_b_proj": (Kind.COLWISE, "colwise"), "o_proj": (Kind.ROWWISE, "rowwise")}
#: the modules an MLA attention holds: a split is exact only when it holds nothing else
#: (another projection, a gate over the heads' output, would stay whole beside split heads)
MLA_KNOWN = frozenset({*MLA_STYLES, "q_a_proj", "q_a_layernorm", "kv_a_layernorm"})
RULE = "<Megatron layout>"


@dataclass
class LayoutReport:
    """What the pass changed and what it left above Megatron's layout (module -> reason)."""

    split: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    #: split fused q|k|v modules -> the config head counts their forward reads (divided)
    config_heads: dict[str, list[str]] = field(default_factory=dict)
    #: norms run split over tp -> the kwargs of their local compute
    sharded_norms: dict[str, dict[str, Any]] = field(default_factory=dict)

    def injections(self, plan: DraftPlan) -> list[dict[str, Any]]:
        """The local compute of every split norm still in the plan (a recipe may have
        placed it otherwise)."""
        from hpcodegen.plan.norms import SHARDED_NORM_TARGET

        return [{"match": fqn, "local_compute_fn": {"_target_": SHARDED_NORM_TARGET, **kw}}
                for fqn, kw in sorted(self.sharded_norms.items())
                if fqn in plan and plan[fqn].get("is_boundary")]

    def notes(self) -> list[str]:
        out = []
        if self.split:
            out.append(f"Megatron layout: {len(self.split)} module(s) split where the HF plan "
                       f"replicates or gathers them, e.g. {self.split[0]}")
        return out






def mla_assignments(modules: Mapping[str, Any], assignments: Mapping[str, Assignment],
                    taken: Collection[str]) -> dict[str, Assignment]:
    """DeepSeek-V2's attention rules for every MLA attention no rule covers."""
    out: dict[str, Assignment] = {}
    for fqn in modules:
        kids = children(modules, fqn)
        if not all(is_linear(kids.get(name)) for name in MLA_REQUIRED):
            continue
        names = [n for n in MLA_STYLES if is_linear(kids.get(n))]
        full = [f"{fqn}.{n}" if fqn else n for n in names]
        if not any(n in ("q_proj", "q_b_proj") for n in names):
            continue
        if any(f in assignments or f in taken for f in full):
            continue  # some rule speaks for this attention: it wins
        held = {n for n, m in kids.items() if any(True for _ in m.parameters())}
        if held - MLA_KNOWN or any(True for _ in modules[fqn].parameters(recurse=False)):
            continue  # a projection or parameter the MLA split does not know
        for name, child in zip(names, full, strict=True):
            kind, style = MLA_STYLES[name]
            out[child] = Assignment(child, kind, 1, style, RULE)
    return out






def _fused_factor(parent: Any, child: Any) -> tuple[int, str]:
    """How many equal blocks a gathered fused projection holds, or 1 and why it stays."""
    blocks = fused_blocks(parent)
    if blocks > 1:
        return blocks, ""
    heads = head_counts(parent)
    out = getattr(child, "out_features", None)
    if heads is None or not isinstance(out, int):
        return 1, "its output is gathered for code the plan cannot split"
    nh, nkv, hd = heads
    if out != (nh + 2 * nkv) * hd:
        return 1, "its output is gathered for code the plan cannot split"
    if nh != nkv:
        return 1, (f"its fused q|k|v holds {nh} query and {nkv} key/value heads: no "
                   "strided shard of the fused rows gives each rank whole query heads with "
                   "their own key/value heads, so the projection output is all-gathered")
    return 3, ""


def config_head_attrs(module: Any) -> list[str]:
    """``config.<count>`` head counts the forward reads from its config (Phi-3 slices its
    fused q|k|v at ``self.config.num_attention_heads * self.head_dim``)."""
    import re

    from hpcodegen.generate.seeds.module_facts import forward_source

    config = config_value(module, "config")
    names = set(re.findall(r"self\.config\.(\w*heads\w*)", forward_source(module)))
    return sorted(f"config.{n}" for n in names if isinstance(config_value(config, n), int))


def split_norms(modules: Mapping[str, Any], parent: str, gathers: list[Assignment],
                flow_of: FlowOf) -> tuple[dict[str, bool], str]:
    """The norms between gathered head projections and the heads (OLMo-2's ``q_norm``
    over ``q_proj``'s whole width), each with its cast order, or why the projections stay
    gathered. Every projection must produce whole heads; a norm is a child the traced
    forward (``flow_of()``) hands a projection's output, and must be an RMS norm whose
    arithmetic :func:`hpcodegen.runtime.norms.rms_norm` reproduces."""
    from hpcodegen.tracer.norms import is_norm

    module = modules[parent]
    heads = head_counts(module)
    names = ", ".join(g.fqn.rsplit(".", 1)[-1] for g in gathers)
    gathered = f"{len(gathers)} projections ({names}) are all-gathered"
    if heads is None:
        return {}, f"{gathered}: the module names no head counts to split them by"
    nh, nkv, hd = heads
    kids = children(modules, parent)
    prefix = f"{parent}." if parent else ""
    norms: dict[str, bool] = {}
    for g in gathers:
        proj = g.fqn.rsplit(".", 1)[-1]
        width = getattr(modules[g.fqn], "out_features", None)
        if width not in (nh * hd, nkv * hd):
            return {}, f"{gathered}: {proj} does not produce whole heads"
        for name, child in kids.items():
            weight = getattr(child, "weight", None)
            if is_norm(child) and getattr(weight, "numel", lambda: 0)() == width \
                    and (flow := flow_of()) is not None \
                    and flow.reads_output(prefix + name, g.fqn):
                cast_last = rms_norm_variant(child)
                if cast_last is None:
                    return {}, (f"{gathered} for {name}, a norm over the whole projection "
                                "width that is not an RMS norm the runtime can split")
                norms[f"{parent}.{name}" if parent else name] = cast_last
    return norms, ""


def rms_norm_variant(module: Any) -> bool | None:
    """Whether the module computes :func:`hpcodegen.runtime.norms.rms_norm` with the cast
    after the weight (True) or before it (False), checked on a real copy with random
    weights and inputs in float32 and bfloat16; None when it computes something else."""
    import copy

    import torch

    from hpcodegen.runtime.norms import norm_eps, rms_norm

    try:
        norm = copy.deepcopy(module).to_empty(device="cpu")
    except Exception:  # a module that cannot be copied: not checked, not split
        return None
    eps = norm_eps(norm)
    weight = getattr(norm, "weight", None)
    if eps is None or not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return None
    gen = torch.Generator().manual_seed(0)
    width = weight.shape[0]
    with torch.no_grad():
        weight.copy_(torch.rand(width, generator=gen) + 0.5)
        x = torch.randn(4, width, generator=gen)
        if not torch.allclose(norm(x), rms_norm(x, weight, eps, width, True, lambda s: s),
                              rtol=1e-5, atol=1e-6):
            return None
        half = norm.to(torch.bfloat16)
        got = half(x.to(torch.bfloat16))
        hits = {last: int((rms_norm(x.to(torch.bfloat16), half.weight, eps, width, last,
                                    lambda s: s) == got).sum()) for last in (True, False)}
    return hits[True] >= hits[False]


def split_gathered(modules: Mapping[str, Any], assignments: dict[str, Assignment],
                   report: LayoutReport, flow_of: FlowOf) -> None:
    """Rewrite gathered fused projections to their packed split (in place); ``flow_of``:
    the model's traced forward (:func:`split_norms`)."""
    parents: dict[str, list[Assignment]] = {}
    for a in assignments.values():
        if a.kind in (Kind.COLWISE_GATHER, Kind.ROWWISE_SPLIT) and not a.param:
            parents.setdefault(parent_of(a.fqn), []).append(a)
    for parent, members in sorted(parents.items()):
        gathers = [a for a in members if a.kind is Kind.COLWISE_GATHER]
        rows = [a for a in members if a.kind is Kind.ROWWISE_SPLIT]
        if not gathers or not rows:
            continue
        if any(a.rule == SEED_RULE for a in members) and (
                len(gathers) > 1 or fused_blocks(modules[parent]) == 1):
            continue  # seeds gather where a head split is not exact; only a projection the
            # forward cuts into equal blocks (ModernBERT's Wi) is packed
        if len(gathers) > 1:
            norms, why = split_norms(modules, parent, gathers, flow_of)
            if why:
                report.kept[parent] = why
                continue
            for g in gathers:
                assignments[g.fqn] = replace(g, kind=Kind.COLWISE, style="colwise", rule=RULE)
            for r in rows:
                assignments[r.fqn] = replace(r, kind=Kind.ROWWISE, style="rowwise", rule=RULE)
            for fqn, cast_last in norms.items():
                assignments[fqn] = Assignment(fqn, Kind.SHARDED_NORM, 1, "sharded_rms_norm",
                                              RULE)
                report.sharded_norms[fqn] = {"cast_last": cast_last}
            report.split.append(parent)
            continue
        factor, why = _fused_factor(modules[parent], modules[gathers[0].fqn])
        if factor == 1:
            report.kept[parent] = why
            continue
        g = gathers[0]
        assignments[g.fqn] = replace(g, kind=Kind.COLWISE, factor=factor,
                                     style=f"packed_colwise:{factor}", rule=RULE)
        for r in rows:
            assignments[r.fqn] = replace(r, kind=Kind.ROWWISE, style="rowwise", rule=RULE)
        report.split.append(parent)
        if fused_blocks(modules[parent]) == 1:  # q|k|v: sliced by the config's head counts
            report.config_heads[parent] = config_head_attrs(modules[parent])


def unplanned_blocks(modules: Mapping[str, Any], assignments: Mapping[str, Assignment],
                     taken: Collection[str]) -> dict[str, Assignment]:
    """Megatron's split for every attention and MLP no rule names (Phi-3.5-MoE's attention,
    Qwen2-MoE's shared expert, a composite model's vision tower), in a model some rule
    already splits: :func:`hpcodegen.generate.seeds.seeds.block_assignments` with MLPs matched
    by transformers' names. A model transformers plans nothing for is seeded from its
    structure instead (:func:`hpcodegen.generate.seeds.seeds.structural_seeds`)."""
    if not assignments:
        return {}
    found = block_assignments(modules, set(assignments) | set(taken), by_shape=False)
    return {fqn: replace(a, rule=RULE) for fqn, a in found.items()}


def unrouted_experts(modules: Mapping[str, Any], assignments: dict[str, Assignment],
                     report: LayoutReport) -> None:
    """Experts taking every token stacked once per expert (Llama-4's: no (index, weight)
    routing) output ``experts x tokens`` rows; all-reducing those would move ``experts``
    times the hidden states. Their block (the experts' parent: router, experts, shared
    expert) becomes the region instead: its output, one row per token, is reduced once."""
    import inspect

    for a in [a for a in assignments.values() if a.kind is Kind.MOE_EXPERTS]:
        sig = inspect.signature(type(modules[a.fqn]).forward).parameters.values()
        if len([p for p in sig if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) > 2:
            continue  # (self, hidden_states, indices, weights): routed
        block = parent_of(a.fqn)
        del assignments[a.fqn]
        for fqn, b in list(assignments.items()):
            if fqn.startswith(f"{block}.") and b.kind in (Kind.COLWISE, Kind.ROWWISE):
                local = Kind.LOCAL_COLWISE if b.kind is Kind.COLWISE else Kind.LOCAL_ROWWISE
                assignments[fqn] = replace(b, kind=local, rule=RULE)
        assignments[block] = Assignment(block, Kind.REDUCE_OUTPUT, 1, "all_reduce", RULE)
        report.split.append(block)


def megatron_layouts(model: Any, assignments: dict[str, Assignment],
                     taken: Collection[str] = (), flow_of: FlowOf | None = None
                     ) -> LayoutReport:
    """Apply the module docstring's rules to the HF assignments (in place); ``taken`` are the
    modules package rules or recipes place (they win); ``flow_of``: the model's traced
    forward, traced on first ask (default: :func:`~hpcodegen.generate.seeds.pair_seeds.seed_flow`
    of ``model``, at most once)."""
    import functools

    from hpcodegen.generate.seeds.pair_seeds import seed_flow

    if flow_of is None:
        flow_of = functools.cache(lambda: seed_flow(model))
    modules = dict(model.named_modules())
    report = LayoutReport()
    mla = mla_assignments(modules, assignments, taken)
    assignments.update(mla)
    report.split += sorted({parent_of(f) for f in mla})
    split_gathered(modules, assignments, report, flow_of)
    blocks = unplanned_blocks(modules, assignments, taken)
    assignments.update(blocks)
    report.split += sorted({parent_of(f) for f in blocks})
    return report


def after_package_rules(model: Any, assignments: dict[str, Assignment], report: LayoutReport,
                        sp: bool, ep: int) -> None:
    """The rules that hold for package rules too (in place): unrouted experts reduced with
    their block. With ``sp`` or ``--ep`` they keep their assignment: both are refused for
    them, with the reason."""
    if not sp and ep <= 1:
        unrouted_experts(dict(model.named_modules()), assignments, report)
