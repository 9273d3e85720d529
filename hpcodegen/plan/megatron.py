"""Megatron's first-principles layout: bytes per rank and parameter bytes per rank (pure).

The yardstick ``bench/plan_quality.py`` and ``generate`` hold a frozen plan against. A
decoder is described by :class:`ModelShape` (what each layer holds: attention, a dense MLP,
routed experts, shared experts; read from the model's modules by
:func:`hpcodegen.generate.layouts.megatron_shape.model_shape`). With ``T = batch x seq`` tokens,
``b`` bytes per element, tp size ``t`` and the bytes that leave a rank (ring algorithms:
``ag(x) = rs(x) = (t-1)/t x``, ``ar(x) = 2 (t-1)/t x``), per forward and per backward:

* every tensor-parallel region (attention, dense MLP, shared experts) on ``hidden``-wide
  activations: without sequence parallelism Megatron's ``g`` (an all_reduce of the
  output) forward and ``f`` (an all_reduce of the input gradient) backward; with it an
  all_gather of the input and a reduce_scatter of the output, and their reverse backward:
  ``2 ag(T hidden b)`` each way, either way;
* the vocab-parallel embedding: its partial lookup reduced (``ar``, or ``rs`` under
  sequence parallelism) forward; backward nothing (token ids), or the ``rs``'s ``ag`` of
  the output gradient under sequence parallelism;
* the output head, column-parallel with its logits gathered (the HF contract: whole
  logits): ``ag(T vocab b)`` forward; its input is a region's (``f`` / all_gather);
* routed experts split over tp without ep: a region over the MoE block (as above; under
  sequence parallelism Megatron's all-gather token dispatcher); with ep, the all-to-all
  dispatcher (:func:`hpcodegen.plan.moe.dispatch_volume`: a rank's tokens, the slice under
  sequence parallelism, sent to their experts and back, ``(ep-1)/ep`` of them leaving the
  rank, then with expert tensor parallelism gathered over tp and reduce-scattered), and
  without sequence parallelism the output all_reduce and input ``f`` of the region.

The gradient sync of replicated parameters (norms under sequence parallelism) and the
routing tensors are not counted: they are per-parameter or ``top_k`` values per token,
small beside the hidden states. Parameter bytes per rank: every projection of attention,
MLP and shared experts split over tp, experts over ``tp x ep``, the embedding and output
head over tp (vocabulary), and replicated what Megatron keeps whole: norms, routers, MLA's
down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``), a row-parallel projection's bias.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hpcodegen.plan.moe import dispatch_volume
from hpcodegen.plan.types import PlanEntry


@dataclass(frozen=True)
class LayerShape:
    """What one decoder layer holds."""

    attention: bool = True
    mlp: str = "dense"  # "dense", "moe" or "" (none)
    shared_experts: bool = False


@dataclass(frozen=True)
class ModelShape:
    """A decoder's communication-relevant sizes, and its parameter bytes split by how
    Megatron places them (element counts, not bytes)."""

    hidden: int
    vocab: int
    layers: tuple[LayerShape, ...]
    top_k: int = 0
    experts: int = 0
    #: elements split over tp, over tp x ep (experts), and kept whole
    tp_params: int = 0
    expert_params: int = 0
    whole_params: int = 0
    tied: bool = False
    notes: tuple[str, ...] = field(default=())


def _ag(n: float, t: int) -> float:
    return (t - 1) / t * n if t > 1 else 0.0


def comm_bytes(shape: ModelShape, tp: int, sp: bool, ep: int, batch: int, seq: int,
               elem: int) -> tuple[float, float]:
    """``(forward, backward)`` bytes per rank of Megatron's layout (module docstring)."""
    tokens = batch * seq
    act = tokens * shape.hidden * elem
    region = 2 * _ag(act, tp)
    fwd = bwd = 0.0
    for layer in shape.layers:
        count = int(layer.attention) + int(layer.mlp == "dense") + int(layer.shared_experts)
        fwd += count * region
        bwd += count * region
        if layer.mlp == "moe":
            f, b = _moe(shape, tp, sp, ep, tokens, elem)
            fwd, bwd = fwd + f, bwd + b
    fwd += _ag(act, tp) * (1 if sp else 2)                     # embedding: rs or ar
    bwd += _ag(act, tp) if sp else 0.0                         # its rs backward: ag
    fwd += _ag(tokens * shape.vocab * elem, tp)                # logits gathered
    fwd += _ag(act, tp) if sp else 0.0                         # head input all_gather
    bwd += _ag(act, tp) * (1 if sp else 2)                     # head input: rs or ar
    return fwd, bwd


def _moe(shape: ModelShape, tp: int, sp: bool, ep: int, tokens: int,
         elem: int) -> tuple[float, float]:
    act = tokens * shape.hidden * elem
    if ep <= 1:
        return 2 * _ag(act, tp), 2 * _ag(act, tp)
    local = tokens // tp if sp and tp > 1 else tokens
    vol = dispatch_volume(local, shape.top_k, shape.hidden, shape.experts, elem, ep,
                          tp if sp else 1)
    fwd = vol.counts + vol.dispatch + vol.combine + vol.tp_counts + vol.tp_gather \
        + vol.tp_scatter
    bwd = vol.dispatch + vol.combine + vol.tp_gather + vol.tp_scatter
    if not sp:  # every tp rank dispatches every token: the region's g and f
        fwd += 2 * _ag(act, tp)
        bwd += 2 * _ag(act, tp)
    return fwd, bwd


def param_bytes(shape: ModelShape, tp: int, ep: int, elem: int) -> float:
    """Parameter bytes per rank of Megatron's layout (module docstring)."""
    return elem * (shape.tp_params / tp + shape.expert_params / (tp * ep)
                   + shape.whole_params)


def plan_param_bytes(entries: Mapping[str, PlanEntry], numels: Mapping[str, int], tp: int,
                     ep: int, elem: int) -> float:
    """Parameter bytes per rank of a frozen plan's entries: each parameter's elements
    divided by the sizes of the axes its placement shards (``tp``, ``ep``); ``numels`` maps
    every parameter FQN of the model (tied ones once) to its element count."""
    from hpcodegen.placement import REPLICATE, is_shard

    total = 0.0
    for fqn, entry in entries.items():
        for rel, named in (entry.params or {}).items():
            name = f"{fqn}.{rel}" if fqn and rel else (fqn or rel)
            if name not in numels:
                continue
            split = 1
            for axis, size in (("tp", tp), ("ep", ep)):
                if is_shard(named.get(axis, REPLICATE)):
                    split *= size
            total += numels[name] / split
    return total * elem
