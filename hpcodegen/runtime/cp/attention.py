"""The CP attention: local queries against K and V all-gathered over cp, exact masks.

Registered with transformers under a per-model attention-implementation name (the model's
config copy carries it, :mod:`.context`), in both of transformers' own extension points:

* ``AttentionInterface``: :func:`attention_function` receives what the model's attention
  module hands its kernel (``module, query, key, value, attention_mask, **kwargs``), all-gathers
  ``key`` and ``value`` over cp **at their own kv-head count** (GQA is expanded by the kernel
  afterwards, as unsharded), and calls the module's kernel: transformers' SDPA function or
  the modeling file's own ``eager_attention_forward`` (softcapping, sinks and scaling stay
  the model's). The gather's backward reduce-scatters dK/dV (:func:`kv_gather`).
* ``AttentionMaskInterface``: transformers' ``create_causal_mask`` /
  ``create_sliding_window_causal_mask`` / ``create_bidirectional_mask`` compose the model's
  mask function per layer type (causal, sliding window of ``config.sliding_window``, ...) and
  hand it to :func:`mask_function`, which evaluates it at this rank's global query
  positions against every gathered key's global position, with the batch's padding and,
  where the model asked transformers for it, its packed documents (transformers' own
  padding and packed-sequence functions, fed the gathered global tensors): the rows of
  the global mask this rank needs, ``[B, 1, S_local, S]``, never ``S x S``; returned
  additive (0 kept, ``-inf`` masked: torch's own reading of a boolean mask), once per
  forward and mask kind, so every layer shares one tensor.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.cp import KV_SEQ_DIM
from hpcodegen.runtime.collectives.autograd import apply_lowered
from hpcodegen.runtime.collectives.comm import Comm
from hpcodegen.runtime.collectives.ops import gather, scatter
from hpcodegen.runtime.cp.state import CPState


def kv_gather(comm: Comm) -> Callable[[torch.Tensor], torch.Tensor]:
    """``S(2) -> R`` over cp as an autograd op: all_gather forward (rows in gathered order),
    reduce_scatter of the gradient backward (every rank's queries contributed to it)."""
    fwd = functools.partial(gather, dim=KV_SEQ_DIM, group=comm)
    bwd = functools.partial(scatter, dim=KV_SEQ_DIM, group=comm)
    return apply_lowered(fwd, bwd)


def eager_kernel(module: Any) -> Callable[..., Any]:
    """The ``eager_attention_forward`` of the file that defines ``module``'s class (the
    generated modeling module: the model's own eager math)."""
    found = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if not callable(found):
        raise PlanError([error("runtime.cp_no_eager", type(module).__name__,
                               "its modeling file defines no eager_attention_forward",
                               hint="use the sdpa_hf wrapper for this attention")])
    return found


def sdpa_kernel() -> Callable[..., Any]:
    """transformers' SDPA function; on CPU with fewer kv heads than query heads, torch's
    SDPA with ``enable_gqa`` instead (:func:`sdpa_gqa_cpu`)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def hpcodegen_cp_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor,
                          value: torch.Tensor, attention_mask: Any, **kwargs: Any) -> Any:
        if query.device.type == "cpu" and key.shape[1] != query.shape[1] \
                and kwargs.get("softcap") is None and not kwargs.get("output_attentions"):
            return sdpa_gqa_cpu(query, key, value, attention_mask, **kwargs)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return hpcodegen_cp_sdpa


def sdpa_gqa_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                 **_: Any) -> tuple[torch.Tensor, None]:
    """What transformers' SDPA function computes for a masked call, with K/V kept at their
    kv-head count (``enable_gqa``): transformers expands them first (``repeat_kv``) because a
    masked GQA call falls back to the math kernel on CUDA; torch's CPU kernel takes it, and
    its backward then keeps the gathered K/V unexpanded (a quarter of the bytes at 4:1)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=False, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


class CPAttention:
    """One attention module's CP kernel call (bound as ``module._hp_cp_attention``).

    Args:
        gather: the cp K/V gather (:func:`kv_gather`); None: none (pure Ulysses).
        kernel: the attention math: SDPA or the model's eager function.
        eager: ``kernel`` takes an additive float mask (transformers' eager convention).
        ulysses: the Ulysses exchange around the kernel
            (:class:`hpcodegen.runtime.cp.ulysses.UlyssesExchange`), run before the gather
            (the hybrid) or alone; None: all-gather only.
    """

    def __init__(self, gather_fn: Callable[[torch.Tensor], torch.Tensor] | None,
                 kernel: Callable[..., Any], eager: bool, ulysses: Any = None) -> None:
        self.gather = gather_fn
        self.kernel = kernel
        self.eager = eager
        self.ulysses = ulysses

    def __call__(self, module: Any, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor, attention_mask: Any, **kwargs: Any) -> Any:
        if kwargs.get("position_bias") is not None:
            raise PlanError([error("runtime.cp_position_bias", type(module).__name__,
                                   "the model passes its own position bias to attention; it "
                                   "is built for the local sequence and cannot be offset")])
        view = module
        if self.ulysses is not None:
            view, query, key, value = self.ulysses.to_heads(module, query, key, value)
        if self.gather is not None:
            key, value = self.gather(key), self.gather(value)
        if self.eager and attention_mask is not None:
            # transformers' eager convention: the dtype's minimum, not -inf (a fully masked
            # row then averages every value, as the unsharded eager model does)
            attention_mask = attention_mask.to(query.dtype).clamp(min=torch.finfo(query.dtype).min)
        if self.ulysses is None:
            return self.kernel(module, query, key, value, attention_mask, **kwargs)
        output, _ = self.kernel(view, query, key, value, attention_mask, **kwargs)
        # the weights cover this rank's heads of the group's rows only: not returned
        return self.ulysses.to_sequence(output), None


def attention_function(state: CPState) -> Callable[..., Any]:
    """The function registered in ``AttentionInterface`` under ``state.name``."""
    def hpcodegen_cp_attention(module: Any, query: torch.Tensor, key: torch.Tensor,
                               value: torch.Tensor, attention_mask: Any, **kwargs: Any) -> Any:
        run = module.__dict__.get("_hp_cp_attention")
        if run is None:
            raise PlanError([error(
                "runtime.cp_unwrapped_attention", type(module).__name__,
                "this attention runs under context parallelism but the plan gives it no cp "
                "inner_wrapper: its queries would only see this rank's keys",
                hint="regenerate the artifact with --cp")])
        return run(module, query, key, value, attention_mask, **kwargs)
    return hpcodegen_cp_attention


def _view(state: CPState) -> Any:
    view = state.batch
    if view is None:
        raise PlanError([error("runtime.cp_no_batch", "model",
                               "a mask was built outside the model's cp forward (the root "
                               "model's forward sets the batch's global positions)",
                               hint="call the parallelized model itself, not a submodule")])
    return view


def mask_function(state: CPState) -> Callable[..., Any]:
    """The function registered in ``AttentionMaskInterface`` under ``state.name``."""
    from transformers.masking_utils import (
        and_masks,
        packed_sequence_compatibility_function,
        padding_mask_function,
    )

    def hpcodegen_cp_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                          kv_offset: int = 0, mask_function: Callable[..., Any] | None = None,
                          use_vmap: bool = False, dtype: torch.dtype = torch.float32,
                          **_: Any) -> torch.Tensor:
        view = _view(state)
        local = view.q_index.shape[0]
        if use_vmap:
            raise PlanError([error(
                "runtime.cp_mask_overlay", "model",
                "the model overlays its own mask function (image tokens, custom masks); "
                "it indexes local tensors and cannot be evaluated at global positions")])
        if (q_length, kv_length, q_offset, kv_offset) != (local, local, 0, 0):
            raise PlanError([error(
                "runtime.cp_mask_shape", "model",
                f"mask requested for q_length={q_length}, kv_length={kv_length}, offsets "
                f"{q_offset}/{kv_offset}; under cp a forward sees its {local} local tokens "
                "without a cache", hint="run training / prefill forwards without a cache")])
        fn = mask_function
        packed, state.packed_requested = state.packed_requested, False
        if packed and view.unreadable_positions:
            raise PlanError([error(
                "runtime.cp_packed_positions", "position_ids",
                "the model asks for packed-document detection but its position ids are not "
                "[batch, seq] (multi-section rotary ids): documents cannot be found on the "
                "whole sequence", hint="pass an attention_mask, or 2-D position ids")])
        if packed and view.documents is not None:
            fn = packed_sequence_compatibility_function(fn, view.positions, view.documents)
        if view.valid is not None:
            fn = and_masks(fn, padding_mask_function(view.valid))
        device = view.q_index.device
        b = torch.arange(batch_size, device=device)[:, None, None, None]
        h = torch.zeros(1, dtype=torch.long, device=device)[None, :, None, None]
        keep = fn(b, h, view.rows[None, None, :, None], view.kv_index[None, None, None, :])
        # torch's own reading of a boolean mask (0 kept, -inf masked), made once per forward
        # and mask kind: every layer's kernel shares it (SDPA would convert a boolean mask
        # per call and keep each copy for the backward)
        zero = torch.zeros((), dtype=dtype, device=device)
        additive = torch.where(keep, zero, float("-inf"))
        return additive.expand(batch_size, 1, view.rows.shape[0], view.kv_index.shape[0])
    return hpcodegen_cp_mask


_REGISTERED: list[str] = []


def register(state: CPState) -> str:
    """Register this model's attention and mask functions under a fresh name; returns it."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    name = f"hpcodegen_cp_{len(_REGISTERED)}"
    _REGISTERED.append(name)
    AttentionInterface.register(name, attention_function(state))
    AttentionMaskInterface.register(name, mask_function(state))
    state.name = name
    return name


__all__ = ["CPAttention", "attention_function", "eager_kernel", "kv_gather", "mask_function",
           "register", "sdpa_kernel"]
