"""The ``param_plan`` entry of an ``experts`` module (HF ``moe_tp_experts``; lazy torch).

Split out of :mod:`hpcodegen.generate.layouts.lift`, which builds every other entry: an experts
region holds every expert parameter, and its transitions depend on whether a rule splits
the experts over tp and on sequence parallelism (docs/moe.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.layouts.entries import PARTIAL, SEQ, tp
from hpcodegen.generate.seeds.module_facts import direct_params
from hpcodegen.placement import REPLICATE, Placement
from hpcodegen.plan.draft import DraftEntry


def moe_entry(entry: DraftEntry, module: Any, params: dict[str, dict[str, Placement]],
              sp: bool, once: Sequence[str] = ()) -> None:
    """An ``experts`` region (HF ``moe_tp_experts``): every expert parameter placed (those
    no rule names replicated) and the transitions of :func:`moe_transitions`.

    When a rule splits the experts over tp, each rank computes a partial output of every
    expert. A per-expert bias of the row-split projection (``once``: a rowwise rule on an
    ``[E, n]`` parameter, GPT-OSS's ``down_proj_bias``) is added inside each expert before
    the routing weight, so it stays whole and only tp rank 0 applies it
    (``tp_rank0_params``): the reduction counts it once, and its gradient, rank 0's, is
    all-reduced like any partial one. Any other parameter left whole there would be applied
    once per rank: refused. With no parameter split the experts compute whole on every tp
    rank and the output is already replicated (the region then only dispatches over ep).

    Raises:
        PlanError: a tp-split experts module holds a replicated parameter no rule declares
            a row-split bias.
    """
    fqn = entry.fqn
    own = direct_params(module)
    for name in own:
        params.setdefault(name, tp(REPLICATE))
    entry.set_placements("params", params)
    split = entry.view().splits_compute()
    whole = sorted(n for n in own if split and params[n].get("tp") == REPLICATE
                   and n not in once)
    if whole:
        raise PlanError([error(
            "generate.moe_replicated_expert_param", f"{fqn}.{whole[0]}",
            f"{type(module).__name__} is split over tp but {', '.join(whole)} "
            f"{'is' if len(whole) == 1 else 'are'} left whole: each rank would apply "
            f"{'it' if len(whole) == 1 else 'them'} to its partial expert output, so the tp "
            "reduction would count it once per rank; not exact",
            expected="every expert parameter sharded with the experts, or none",
            hint="shard it with the experts (colwise on a per-expert vector), declare "
                 "the row-split projection's bias with a rowwise rule (tp rank 0 adds it), "
                 "or keep the experts whole over tp (no rule on their parameters)")])
    moe_transitions(entry, module, sp, split)
    if split and once:
        entry.set("tp_rank0_params", tuple(sorted(once)))
        entry.set("partial_grad_params", tuple(sorted(once)))
    elif sp and not split and own:  # whole experts computing this rank's slice of tokens
        entry.set("partial_grad_params", tuple(sorted(own)))


def moe_transitions(entry: DraftEntry, module: Any, sp: bool, split: bool = True) -> None:
    """An ``experts`` region (HF ``moe_tp_experts``, ``forward(hidden_states, top_k_index,
    top_k_weights)``): its transitions.

    Without ``sp`` the hidden states and routing weights arrive replicated; with the compute
    ``split`` over tp both inputs' gradients are partial and all-reduced in the backward
    (the classifier's rule for a replicated input of a compute-splitting boundary), as HF's
    ``MoeExpertsParallel`` does, and the partial output is all-reduced; unsplit, the output
    is whole on every rank (replicated). The integer expert indices carry no gradient and
    pass through untouched.

    With ``sp`` every rank routes its own slice of the tokens (routing is per token), so the
    three inputs arrive sharded on the token dim (``S(1)`` here; generate's token-dim pass,
    :mod:`hpcodegen.generate.layouts.token_dims`, makes it the traced dim). A split compute gathers
    them (the indices too: ``no_grad_inputs``, an all_gather without backward) and
    reduce-scatters its partial output back onto the slice, the layout of Megatron's
    all-gather token dispatcher; unsplit, the experts compute the slice whole (identity).
    ``--ep`` turns this into the dispatch on the slice (:func:`hpcodegen.generate.layouts.experts.
    shard_experts`).

    Raises:
        PlanError: with ``sp``, the forward takes no (indices, weights) routing: its rows
            are not tokens (Llama-4's experts take every token stacked once per expert).
    """
    params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if sp:
        _moe_sp_transitions(entry, module, names[:3], split)
        return
    # HF's contract: forward(hidden_states, top_k_index, top_k_weights, ...)
    names = [names[0], *names[2:3]] if names else names
    _boundary(entry, names, arrive=REPLICATE, inner=REPLICATE,
              out=PARTIAL if split else REPLICATE, leave=REPLICATE)


def _boundary(entry: DraftEntry, names: list[str], *, arrive: Placement, inner: Placement,
              out: Placement, leave: Placement) -> None:
    """The experts block as a boundary of one output: its inputs arrive ``arrive`` and are
    computed on as ``inner``; its output leaves the compute ``out`` and goes on ``leave``
    (all on tp)."""
    entry.set_placements("in_src", {n: tp(arrive) for n in names})
    entry.set_placements("in_dst", {n: tp(inner) for n in names})
    entry.set_placements("out_src", {"output": tp(out)})
    entry.set_placements("out_dst", {"output": tp(leave)})
    entry.set("out_names", ("output",))
    entry.set("is_boundary", True)


def _moe_sp_transitions(entry: DraftEntry, module: Any, names: list[str],
                        split: bool) -> None:
    if len(names) < 3:
        raise PlanError([error(
            "generate.moe_sp_unrouted", type(module).__name__,
            f"{type(module).__name__}.forward({', '.join(names)}) takes no expert indices and "
            "routing weights: its rows are not one per token (the tokens come stacked once "
            "per expert, pre-scaled by the router), so sequence parallelism (--sp) cannot "
            "hand it one rank's slice of the tokens",
            expected="forward(hidden_states, expert_indices, routing_weights)",
            hint="generate without --sp")])
    _boundary(entry, names, arrive=SEQ, inner=REPLICATE if split else SEQ,
              out=PARTIAL if split else SEQ, leave=SEQ)
    entry.set("no_grad_inputs", (names[1],))
