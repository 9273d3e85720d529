"""``generate --cp N``: add the cp axis to a lifted plan, or refuse what it cannot make exact.

The plan keeps the existing system's conventions (:mod:`hpcodegen.plan.cp`): every
parameter ``cp: R``; every boundary value ``cp: S(d)`` on both sides, ``d`` its sequence
dim as the probe forward saw it (``S(1)`` for ``[batch, seq, ...]`` activations, ``S(0)``
for the flattened tokens an experts region takes); one injection per attention module
naming the CP attention (``sdpa_hf``: transformers' SDPA kernel, or ``eager_hf`` where the
model needs its own eager math, e.g. attention softcapping) with its K/V transition
``S(2) -> R`` over cp declared in ``inner_in_src``/``inner_in_dst``.

Refused, with the reason (:func:`check_cp_model`), from the probe forward
(:mod:`hpcodegen.generate.layouts.cp_probe`): a token mixer outside the attention interface
(recurrent, state-space, convolutional or time-shift mixers, attention the model computes
itself such as ALiBi's), an attention that gets its own position bias, keys that are not
the sequence's own tokens (cross-attention), a mask function the model overlays itself,
chunked attention, a model whose forward takes no ``position_ids`` or ``attention_mask``
(the ranks must place their tokens at global positions), a forward that cannot be traced.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from hpcodegen.errors import PlanError, UsageError, error
from hpcodegen.generate.layouts.cp_probe import BATCH, CPProbe
from hpcodegen.placement import REPLICATE, Shard
from hpcodegen.plan.cp import (
    ALLGATHER,
    CONTIGUOUS,
    HEADTAIL,
    HYBRID,
    LAYOUTS,
    ULYSSES_DEGREE,
    method_transitions,
)
from hpcodegen.plan.draft import DraftPlan
from hpcodegen.plan.entry import TRANSITION_FIELDS

#: config fields of attention patterns the mask rows cannot reproduce
CHUNKED_FIELDS: tuple[str, ...] = ("attention_chunk_size",)


def _refuse(code: str, where: str, message: str, hint: str | None = None) -> PlanError:
    return PlanError([error(code, where, f"--cp: {message}", hint=hint or "generate without --cp")])


def _config_value(config: Mapping[str, Any], key: str) -> Any:
    for scope in (config, config.get("text_config") or {}):
        if isinstance(scope, Mapping) and scope.get(key) is not None:
            return scope.get(key)
    return None


def check_cp_model(model: Any, config: Mapping[str, Any], probe: CPProbe) -> None:
    """Refuse (PlanError) what context parallelism cannot make exact; see the module doc."""
    if probe.failure is not None:
        raise _refuse("generate.cp_trace", "<root>",
                      f"the model's forward does not run on the meta device "
                      f"({probe.failure}), so its token mixers cannot be checked")
    if probe.mixing:
        fqn, why = probe.mixing[0]
        more = len({f for f, _ in probe.mixing}) - 1
        raise _refuse("generate.cp_token_mixer", fqn or "<root>",
                      f"{fqn or 'the model'} mixes tokens outside transformers' attention "
                      f"interface ({why}{f'; {more} more module(s)' if more > 0 else ''}): "
                      "under cp it would see only its rank's chunk of the sequence "
                      "(recurrent, state-space, convolutional or time-shift token mixers and "
                      "attention a model computes itself cannot be made exact)")
    if not probe.attention:
        raise _refuse("generate.cp_no_attention", "<root>",
                      "no module calls transformers' attention interface: nothing to "
                      "all-gather over cp")
    for fqn, call in probe.attention.items():
        if call.position_bias:
            raise _refuse("generate.cp_position_bias", fqn,
                          "the attention gets a position bias the model builds for the whole "
                          "sequence; its rows cannot be offset per cp rank")
        if call.key[2] != probe.length or call.query[2] != probe.length:
            raise _refuse("generate.cp_cross_attention", fqn,
                          f"its keys ({call.key[2]}) or queries ({call.query[2]}) are not the "
                          f"sequence's own {probe.length} tokens (cross-attention)")
    if probe.own_mask:
        raise _refuse("generate.cp_own_mask", probe.own_mask[0],
                      "the attention hands its kernel another mask than transformers built "
                      "for the sequence (its own selection of keys folded in, e.g. a "
                      "sparse-attention indexer): that mask is made from this rank's chunk "
                      "only")
    if probe.mask_overlay:
        raise _refuse("generate.cp_mask_overlay", "<root>",
                      "the model overlays its own mask function on transformers' masks; it "
                      "indexes local tensors and cannot be evaluated at global positions")
    for key in CHUNKED_FIELDS:
        if _config_value(config, key) is not None:
            raise _refuse("generate.cp_chunked_attention", f"/{key}",
                          f"{key}={_config_value(config, key)}: chunked attention is not "
                          "reproduced by the cp mask rows")
    try:
        accepts = set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        accepts = set()
    missing = [n for n in ("position_ids", "attention_mask") if n not in accepts]
    if missing:
        raise _refuse("generate.cp_inputs", type(model).__name__,
                      f"its forward takes no {' or '.join(missing)}: a cp rank could not place "
                      "its tokens at their global positions")


def default_layout(probe: CPProbe) -> str:
    """Head-tail for causal models (balanced causal work), contiguous otherwise."""
    causal = all(call.is_causal for call in probe.attention.values())
    return HEADTAIL if causal else CONTIGUOUS


def check_layout(layout: str | None) -> None:
    if layout is not None and layout not in LAYOUTS:
        raise UsageError([error("generate.cp_layout", "--cp-layout",
                                f"unknown layout {layout!r}", expected=", ".join(LAYOUTS))])


def _seq_placement(shape: tuple[int, ...] | None, length: int) -> Shard:
    """``S(d)`` for the value's sequence dim (``length``, or ``BATCH x length`` flattened)."""
    for i, n in enumerate(shape or ()):
        if n in (length, BATCH * length):
            return Shard(i)
    return Shard(1)


def _kernel(probe: CPProbe, fqn: str) -> str:
    call = probe.attention[fqn]
    return "eager_hf" if call.softcap or probe.implementation == "eager" else "sdpa_hf"


def add_cp_axis(plan: DraftPlan, injections: list[dict[str, Any]],
                probe: CPProbe, classes: Mapping[str, str] | None = None,
                method: str = ALLGATHER, ulysses: int = 1) -> list[dict[str, Any]]:
    """The cp placements on every entry (in place) and the injections with one CP
    attention record per kernel kind (list ``match``, as the existing system groups them),
    for ``method`` (:func:`hpcodegen.plan.cp.method_transitions`: the wrapper's registry
    name, the transitions it runs declared, the hybrid's ``ulysses_degree``, and under
    Ulysses the heads the rule was checked on, ``cp_heads``).

    One class has one generated forward, so its instances get one cp placement per value:
    the first instance's (sorted FQN). A class called on ``[batch, seq, ...]`` in one place
    and on flattened tokens in another (a dense MLP reused as MoE shared experts) is
    identity on cp either way; the placement only names the dim.
    """
    chosen: dict[tuple[str, str, str], Shard] = {}
    for fqn, entry in sorted(plan.items(), key=lambda item: item[0]):
        for name, named in entry.placements("params").items():
            entry.place("params", name, {**named, "cp": REPLICATE})
        if not entry.boundary:
            continue
        cls = (classes or {}).get(fqn, fqn)
        for key in TRANSITION_FIELDS:
            side = key.split("_")[0]
            for name, named in entry.placements(key).items():
                seen = _seq_placement(probe.shapes.get((fqn, side, name)), probe.length)
                entry.place(key, name, {**named, "cp": chosen.setdefault((cls, key, name),
                                                                           seen)})
    taken = {fqn for record in injections for fqn in _matches(record)}
    clash = sorted(taken & set(probe.attention))
    if clash:
        raise _refuse("generate.cp_injection_clash", clash[0],
                      "a recipe or rule already injects into this attention; the CP attention "
                      "wraps it", hint="drop that injection (the CP wrappers run the SDPA or "
                                       "eager kernel themselves)")
    groups: dict[tuple[str, bool, int, int], list[str]] = {}
    for fqn in sorted(probe.attention):
        plan.param_entry(fqn)
        call = probe.attention[fqn]
        heads = (call.query[1], call.key[1]) if method != ALLGATHER else (0, 0)
        groups.setdefault((_kernel(probe, fqn), call.is_causal, *heads), []).append(fqn)
    suffix = "" if method == ALLGATHER else f"_{method}"
    degree = {ULYSSES_DEGREE: ulysses} if method == HYBRID else {}
    records = []
    for (kernel, causal, q_heads, kv_heads), fqns in sorted(groups.items()):
        record = {"match": fqns, "inner_target": "self",
                  "inner_wrapper": {"_target_": kernel + suffix, "causal": causal, **degree},
                  **method_transitions(method)}
        if method != ALLGATHER:
            record["cp_heads"] = {"query": q_heads, "key_value": kv_heads}
        records.append(record)
    return injections + records


def _matches(record: Mapping[str, Any]) -> list[str]:
    match = record.get("match")
    return [match] if isinstance(match, str) else list(match or ())


__all__ = ["add_cp_axis", "check_cp_model", "check_layout", "default_layout"]
