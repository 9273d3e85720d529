"""Megatron's layout found from a model's dataflow where the module tree does not show it.

:mod:`hpcodegen.generate.seeds.seeds` reads blocks off the module tree: a module holding an MLP's
or an attention's Linears is one region. Three things the tree cannot tell are facts of one
forward (:func:`hpcodegen.tracer.dataflow.linear_flow`, on the meta model), read here:

* **a pair of Linears outside any clean block**: ``A`` (``h -> i``) whose output reaches
  ``B`` (``i -> h``) through ops torch tags pointwise only, and nothing else reads it whole
  (OPT's ``fc1``/``fc2``, children of a decoder layer that also adds the residuals; GIT's
  two dense layers in two modules; an MLP adding its residual itself, BLOOM's;
  XLNet's feed-forward). Each rank computes its own slice of ``B``'s input, so ``A`` is
  ``colwise_gather_output`` with its output kept sharded (``out_dst S(-1)``) and ``B``
  ``rowwise_split_input`` taking that shard (``in_src S(-1)``): one all-reduce, as a region
  would cost. Where the pair's parent holds nothing else and returns ``B``'s output
  unchanged (CTRL's ``nn.Sequential`` feed-forward) the parent is the region instead.
* **a block that adds a residual after its closing Linear** (the module returns something
  else than that Linear's output): no region, its partial sum would be added to the
  residual on every rank. A seeded region whose module does so is dropped (the pair rule
  then splits its Linears one by one).
* **a Linear the forward never calls as a module** (BLOOM's ``slow_but_exact`` reads
  ``dense.weight`` itself; a vision tower a text forward never runs): nothing seeded
  around it is split, as no boundary of it would ever run.

Attentions the tree leaves whole but the forward shows are self-attentions are
:mod:`hpcodegen.generate.seeds.attention_seeds`'. A model whose forward does not run on the meta
device keeps the seeds as they are.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcodegen.generate.seeds.attention_seeds import attention_by_use, outside, split_attentions
from hpcodegen.generate.seeds.seeds import SEED_RULE, is_linear
from hpcodegen.generate.sources.globs import parent_of
from hpcodegen.generate.sources.hf_plan import Assignment
from hpcodegen.generate.sources.styles import Kind
from hpcodegen.placement import Shard
from hpcodegen.plan.draft import DraftPlan
from hpcodegen.tracer.dataflow import Flow

#: the shard a pair's first Linear keeps on its output and its second reads
LAST_DIM = {"tp": Shard(-1)}
_REGION = (Kind.COLWISE, Kind.ROWWISE)


@dataclass
class PairSeeds:
    """What the dataflow changed in the seeds: assignments to add, blocks dropped, and the
    pairs whose shard flows between two boundaries (``(A, B)`` FQNs)."""

    add: dict[str, Assignment] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # block -> why
    flows: list[tuple[str, str]] = field(default_factory=list)
    #: attention -> width attributes its forward reads that the runtime must divide too
    divide: dict[str, list[str]] = field(default_factory=dict)
    #: attention -> its other inputs its projections read (boundary inputs like the first)
    inputs: dict[str, list[str]] = field(default_factory=dict)
    #: the Linears the forward never calls: no later layout splits their blocks either
    uncalled: frozenset[str] = frozenset()

    def notes(self) -> list[str]:
        if not self.add and not self.dropped:
            return []
        note = (f"dataflow seeds: {len(self.flows)} Linear pair(s) split with the shard "
                f"flowing between them (hpcodegen/generate/seeds/pair_seeds.py)")
        if self.flows:
            note += f", e.g. {self.flows[0][0]} -> {self.flows[0][1]}"
        if self.dropped:
            block, why = next(iter(sorted(self.dropped.items())))
            note += f"; {len(self.dropped)} seeded block(s) kept whole, e.g. {block}: {why}"
        return [note]


def _blocks(seeds: Mapping[str, Assignment]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for fqn in seeds:
        out.setdefault(parent_of(fqn), []).append(fqn)
    return out


def unfit_block(block: str, members: Collection[str], seeds: Mapping[str, Assignment],
                flow: Flow) -> str | None:
    """Why a seeded block cannot be split as seeded (module docstring), or None."""
    uncalled = sorted(m for m in members if not seeds[m].param and m not in flow.called)
    if uncalled:
        return f"the forward never calls {uncalled[0]} as a module"
    rows = [m for m in members if seeds[m].kind is Kind.ROWWISE]
    if rows and flow.returns.get(block) != rows[0]:
        return f"it returns something else than {rows[0]}'s output (a residual added inside)"
    return None


def _pair_of(b: str, modules: Mapping[str, Any], flow: Flow, free: Collection[str],
             feeders: Mapping[str, list[str]]) -> list[str] | None:
    """The Linears ``A`` that feed ``b`` as Megatron's pair, or None."""
    sources = sorted(flow.feeds.get(b, ()))
    if not sources or b not in free or not is_linear(modules.get(b)):
        return None
    lin_b = modules[b]
    for a in sources:
        lin_a = modules.get(a)
        if (a not in free or a in flow.escapes or not is_linear(lin_a) or feeders[a] != [b]
                or lin_a.out_features != lin_b.in_features
                or lin_a.in_features != lin_b.out_features):
            return None
    return sources


def _is_region(parent: str, pair: list[str], b: str, modules: Mapping[str, Any],
               flow: Flow) -> bool:
    """Whether the pair's common parent can be their region: it holds no other parameter
    and returns ``b``'s output unchanged."""
    if not parent or any(parent_of(x) != parent for x in pair) or flow.returns.get(parent) != b:
        return False
    held = {id(p) for x in (*pair, b) for p in modules[x].parameters()}
    return all(id(p) in held for p in modules[parent].parameters())


def pair_assignments(modules: Mapping[str, Any], flow: Flow, taken: Collection[str]
                     ) -> tuple[dict[str, Assignment], list[tuple[str, str]]]:
    """Megatron's pairs among the Linears no module of ``taken`` is at, inside or above:
    their assignments, and the ``(A, B)`` pairs whose shard flows between boundaries."""
    free = {f for f in flow.feeds if outside(f, taken)}
    feeders: dict[str, list[str]] = {}
    for b, sources in flow.feeds.items():
        for a in sources:
            feeders.setdefault(a, []).append(b)
    out: dict[str, Assignment] = {}
    flows: list[tuple[str, str]] = []
    for b in sorted(flow.feeds):
        pair = _pair_of(b, modules, flow, free, feeders)
        if pair is None:
            continue
        region = _is_region(parent_of(b), pair, b, modules, flow)
        col, row = _REGION if region else (Kind.COLWISE_GATHER, Kind.ROWWISE_SPLIT)
        for fqn, kind in [*((a, col) for a in pair), (b, row)]:
            out[fqn] = Assignment(fqn, kind, 1, kind.value, SEED_RULE)
        if not region:
            flows.extend((a, b) for a in pair)
    return out, flows


def dataflow_seeds(model: Any, seeds: Mapping[str, Assignment], taken: Collection[str],
                   flow: Flow | None) -> PairSeeds:
    """What the dataflow changes in the structural ``seeds`` (module docstring): blocks to
    drop and pairs to add, outside the modules ``taken`` by package rules or a recipe."""
    result = PairSeeds()
    if flow is None or (not seeds and not flow.feeds):
        return result
    modules = dict(model.named_modules())
    for block, members in _blocks(seeds).items():
        why = unfit_block(block, members, seeds, flow)
        if why is not None:
            result.dropped[block] = why
    result.uncalled = frozenset(f for f, m in modules.items()
                                if is_linear(m) and f not in flow.called)
    kept = [f for f in seeds if parent_of(f) not in result.dropped]
    heads, result.divide, result.inputs = attention_by_use(modules, flow, [*taken, *kept])
    heads.update(split_attentions(modules, flow, [*taken, *kept, *heads]))
    result.add, result.flows = pair_assignments(modules, flow, [*taken, *kept, *heads])
    result.add.update(heads)
    return result


def finish_plan(plan: DraftPlan, changes: PairSeeds) -> None:
    """After the lift: each pair's first Linear keeps its output sharded on the last dim,
    and its second takes that shard (the entries the lifter wrote gather and split it
    again); an attention's width attributes are divided with its head counts."""
    for fqn, attrs in changes.divide.items():
        if fqn in plan and attrs:
            plan[fqn].add_names("tp_divide_attrs", attrs)
    for fqn, names in changes.inputs.items():
        entry = plan.get(fqn)
        for side in ("in_src", "in_dst"):
            first = None if entry is None else next(iter(entry.placements(side).values()),
                                                    None)
            if first is not None:
                for name in names:
                    entry.place(side, name, first)
    for a, b in changes.flows:
        if a in plan and b in plan:
            for name in plan[a].placements("out_dst"):
                plan[a].place("out_dst", name, LAST_DIM)
            for name in plan[b].placements("in_src"):
                plan[b].place("in_src", name, LAST_DIM)


def seed_flow(model: Any) -> Flow | None:
    """THE traced forward every seed and layout pass of one generate reads (the order of a
    block's calls, which child reads which output, Linear pairs, attentions by use): one
    :func:`~hpcodegen.tracer.dataflow.linear_flow` of the meta model, the attentions'
    first calls recorded; None when the model does not run on meta."""
    from hpcodegen.generate.seeds.attention_seeds import may_be_attention
    from hpcodegen.tracer.dataflow import linear_flow

    return linear_flow(model, is_linear, lambda _f, m: may_be_attention(m))


def refined_seeds(model: Any, hf: Any, replaced: bool, taken: Collection[str],
                  seeds: Mapping[str, Assignment], flow: Flow | None
                  ) -> tuple[dict[str, Assignment], PairSeeds]:
    """The structural ``seeds`` with the dataflow's changes (read from ``flow``,
    :func:`seed_flow`) applied, and those changes; nothing changes where the structural
    seeds do not run (transformers plans the layers, or a package rule file replaces its
    plan)."""
    from hpcodegen.generate.seeds.seeds import plans_layers

    if replaced or plans_layers(model, hf):
        return dict(seeds), PairSeeds()
    changes = dataflow_seeds(model, seeds, taken, flow)
    kept = {f: a for f, a in seeds.items() if parent_of(f) not in changes.dropped}
    return {**kept, **changes.add}, changes
