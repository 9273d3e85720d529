"""Build a ``pipeline`` section: split the model's units into stages and freeze a schedule
(pure, no torch; generate feeds it what it read off the meta-device model).

The split is contiguous in forward order. By default it balances per-stage cost, where a
unit's cost is its parameter count: a decoder layer's matmul FLOPs and its memory (weights,
gradients, optimizer state) both scale with it, and it counts the embedding and the head
as the heavy units they are (torchtitan counts them as one layer each; a Llama-3-8B
embedding is 2.4 layers). ``layout`` gives the decoder layers per stage instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcodegen.plan.pipeline import LOSS_NORMALIZER, LOSS_REDUCTION, owning_stage
from hpcodegen.plan.schedule import (
    actions_digest,
    actions_to_json,
    build_actions,
    schedule_spec,
    stage_rank,
)
from hpcodegen.plan.schedule_sim import simulate

#: Side inputs of a decoder layer, rebuilt on each stage from the microbatch's shape.
SIDE_INPUTS: dict[str, str] = {"position_ids": "recomputed", "attention_mask": "recomputed",
                               "position_embeddings": "recomputed"}


class SplitError(ValueError):
    """A pipeline that cannot be built; the message says what and what was expected."""


@dataclass(frozen=True, slots=True)
class Unit:
    """One split unit in forward order: a module FQN, its parameter count, and whether it
    is a repeated layer (``layout`` counts only those)."""

    fqn: str
    params: int
    is_layer: bool


def _partition(costs: Sequence[int], k: int) -> list[int]:
    """Stage sizes (unit counts) of the contiguous split of ``costs`` into ``k`` non-empty
    parts minimising the largest part's sum (ties: the earliest cut that achieves it)."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for c in range(j - 1, i):
                value = max(best[j - 1][c], prefix[i] - prefix[c])
                if value < best[j][i]:
                    best[j][i], cut[j][i] = value, c
    sizes, i = [], n
    for j in range(k, 0, -1):
        sizes.append(i - cut[j][i])
        i = cut[j][i]
    return sizes[::-1]


def _layout_sizes(units: Sequence[Unit], layout: Sequence[int], k: int) -> list[int]:
    layers = sum(u.is_layer for u in units)
    if len(layout) != k or sum(layout) != layers or any(n < 0 for n in layout):
        raise SplitError(f"--pp-layout {','.join(map(str, layout))}: expected {k} counts "
                         f"of decoder layers (one per stage) summing to {layers}")
    sizes, i = [], 0
    for s, count in enumerate(layout):
        start = i
        while i < len(units) and not units[i].is_layer and (s == 0 or count == 0):
            i += 1  # the leading units (embedding) go with the first stage
        seen = 0
        while i < len(units) and seen < count:
            seen += units[i].is_layer
            i += 1
        if s == k - 1:
            i = len(units)  # the trailing units (norm, head) go with the last stage
        if i == start:
            raise SplitError(f"--pp-layout: stage {s} would own no module (empty stages "
                             "deadlock or waste a rank)")
        sizes.append(i - start)
    return sizes


def split_units(units: Sequence[Unit], n_stages: int,
                layout: Sequence[int] | None = None) -> list[list[str]]:
    """The FQNs of each stage, contiguous in forward order.

    Raises:
        SplitError: more stages than units or layers, an empty stage, a layout that does
            not add up.
    """
    layers = sum(u.is_layer for u in units)
    if n_stages > layers:
        raise SplitError(f"{n_stages} pipeline stages for {layers} layers: every stage "
                         "needs at least one layer (lower --pp or the stages per rank)")
    sizes = (_layout_sizes(units, layout, n_stages) if layout is not None
             else _partition([max(u.params, 1) for u in units], n_stages))
    out, i = [], 0
    for size in sizes:
        out.append([u.fqn for u in units[i:i + size]])
        i += size
    return out


def build_pipeline(units: Sequence[Unit], *, pp: int, schedule: str, n_microbatches: int,
                   stages_per_rank: int = 1, layout: Sequence[int] | None = None,
                   replicated: Sequence[str] = (), activation: str = "hidden_states",
                   placements: Mapping[str, str] | None = None,
                   tied: Sequence[Sequence[str]] = ()) -> dict[str, Any]:
    """The ``pipeline`` section (JSON) for a model's units.

    Args:
        units: the split units in forward order.
        pp, schedule, n_microbatches, stages_per_rank: the pipeline's shape.
        layout: decoder layers per stage, or None to balance parameter counts.
        replicated: parameter-free modules every stage keeps (rotary).
        activation, placements: what crosses a stage boundary and its placement.
        tied: groups of tied parameter FQNs (the model's); a group split across stages is
            recorded in ``tied_across_stages``.

    Raises:
        SplitError: a shape the schedule or the model cannot take.
    """
    try:
        spec = schedule_spec(schedule)
    except ValueError as exc:
        raise SplitError(str(exc)) from None
    v = spec.stages_per_rank or stages_per_rank
    if spec.stages_per_rank is None and v < 2:
        raise SplitError(f"{schedule} needs 2 or more stages per rank (--pp-stages-per-rank)")
    if pp < 2:
        raise SplitError(f"--pp {pp}: a pipeline needs 2 or more ranks")
    n_stages = pp * v
    stages = split_units(units, n_stages, layout)
    try:
        actions = build_actions(schedule, pp, n_microbatches, v)
    except ValueError as exc:
        raise SplitError(str(exc)) from None
    sim = simulate(actions, pp=pp, n_stages=n_stages, n_microbatches=n_microbatches,
                   style=spec.style)
    if not sim.ok:  # cannot happen for our builders; never freeze an unchecked list
        raise SplitError(f"{schedule} pp={pp} m={n_microbatches}: {sim.problems[0].message}")
    owner = {fqn: i for i, mods in enumerate(stages) for fqn in mods}
    return {
        "pp_size": pp, "schedule": schedule, "style": spec.style, "stages_per_rank": v,
        "n_microbatches": n_microbatches, "microbatch_dim": 0,
        "module_order": [u.fqn for u in units],
        "replicated_modules": list(replicated),
        "stages": [{"index": i, "rank": stage_rank(i, pp, spec.style), "modules": mods}
                   for i, mods in enumerate(stages)],
        "boundary": {"activation": activation, "placements": dict(placements or {}),
                     "side_inputs": dict(SIDE_INPUTS)},
        "tied_across_stages": _tied_across(tied, owner),
        "loss": {"reduction": LOSS_REDUCTION, "normalizer": LOSS_NORMALIZER,
                 "scale_grads": False},
        "actions": actions_to_json(actions),
        "actions_sha256": actions_digest(actions),
    }


def _tied_across(tied: Sequence[Sequence[str]], owner: Mapping[str, int]) -> list[dict]:
    out = []
    for group in tied:
        stages = [owning_stage(p, owner) for p in group]
        if len({s for s in stages if s is not None}) > 1:
            out.append({"params": list(group), "stages": stages, "grad": "sum"})
    return out


def split_backward_partials(entries: Mapping[str, Any], schedule: str, tp: int) -> list[str]:
    """The parameters that make ``schedule`` inexact at this tp: a zero-bubble backward
    (``I`` then ``W``) with gradients partial over tp, which the runtime sums once per
    whole backward (``entries``: the typed plan entries). Empty: nothing in the way."""
    try:
        split = schedule_spec(schedule).split_backward
    except ValueError:
        return []
    if not split or tp <= 1:
        return []
    return sorted(f"{fqn}.{name}" if name else fqn for fqn, entry in entries.items()
                  for name in entry.effective_partial_grad_params())


def split_backward_message(schedule: str, partial: Sequence[str]) -> str:
    """The one wording of :func:`split_backward_partials`' refusal (generate and verify)."""
    return (f"{schedule} splits the backward into input and weight gradients, but "
            f"{len(partial)} parameter(s) have gradients partial over tp (e.g. {partial[0]}): "
            "their tp sum runs once per whole backward, not yet per split one")


def stage_param_counts(units: Sequence[Unit], stages: Sequence[Sequence[str]]) -> list[int]:
    """Parameters per stage (a tied copy counts on each stage holding it)."""
    params = {u.fqn: u.params for u in units}
    return [sum(params.get(f, 0) for f in mods) for mods in stages]
