"""Embedding-specific install steps: the vocab-parallel lookup and SP default position ids.

* A ``nn.Embedding`` whose weight is ``Shard(0)`` on tp holds rows ``[start, end)`` of the
  vocabulary. Ids outside are looked up as a clamped row and their rows zeroed, so the output is a
  ``Partial(sum)`` over tp, which the boundary's output op then reduces.
* With sequence parallelism the embedding output leaves sharded on dim 1
  (:func:`hpcodegen.plan.entry.output_sequence_sharded` of a
  :func:`~hpcodegen.plan.entry.takes_token_ids` class), and HF's
  ``*Model.forward`` derives default ``position_ids`` from ``inputs_embeds.shape[1]`` (now the
  local length). The parent forward is wrapped to pass the global ``arange(seq_len)`` built
  from ``input_ids``. The causal mask is then right for sdpa without a padding mask (it is
  None: attention runs ``is_causal`` on the gathered sequence); an explicit 2-D padding mask
  would be sized for the local length and is not supported with SP.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hpcodegen.runtime.mesh import TP, ActiveMesh
from hpcodegen.runtime.params import ShardedParam


def install_vocab_parallel(module: nn.Embedding, start: int) -> None:
    """Replace the instance forward by the masked lookup of the local vocabulary rows."""

    def vocab_parallel_forward(input: torch.Tensor) -> torch.Tensor:
        weight = module.weight
        rows = weight.shape[0]
        shifted = input - start
        local_ids = shifted.clamp(0, rows - 1)  # ids outside the shard: any valid row ...
        outside = shifted != local_ids  # ... zeroed below (6 ops: fewer than two bounds)
        pad = module.padding_idx
        local_pad = pad - start if pad is not None and 0 <= pad - start < rows else None
        out = F.embedding(local_ids, weight, local_pad, module.max_norm, module.norm_type,
                          module.scale_grad_by_freq, module.sparse)
        return out.masked_fill(outside.unsqueeze(-1), 0.0)

    module.forward = vocab_parallel_forward
    module._hp_vocab_range = (start, start + module.weight.shape[0])


def row_sharded_vocab_start(module: nn.Module, record: ShardedParam | None,
                            active: ActiveMesh) -> int | None:
    """The first vocabulary row this rank holds when ``module`` is an ``nn.Embedding``
    instance (the masked lookup uses its attributes) whose weight Phase A sharded by rows
    on tp; else None. ``record`` is the weight's :class:`ShardedParam`."""
    if not isinstance(module, nn.Embedding) or record is None or TP not in active.axes:
        return None
    tp_placement = record.placements[active.axes.index(TP)]
    if tp_placement.is_shard() and getattr(tp_placement, "dim", None) == 0:
        return record.global_offset[0]
    return None


def install_default_position_ids(parent: nn.Module) -> bool:
    """Wrap ``parent.forward`` to pass global default ``position_ids``; False if it can't."""
    if getattr(parent, "_hp_position_ids_wrapped", False):
        return True
    original = parent.forward
    sig = inspect.signature(original)
    if "input_ids" not in sig.parameters or "position_ids" not in sig.parameters:
        return False

    positional = [n for n, p in sig.parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    index = positional.index("position_ids") if "position_ids" in positional else None

    def sp_position_ids_forward(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind_partial(*args, **kwargs)
        input_ids = bound.arguments.get("input_ids")
        if bound.arguments.get("position_ids") is not None or input_ids is None:
            return original(*args, **kwargs)
        cache = bound.arguments.get("past_key_values")
        seen = cache.get_seq_length() if cache is not None else 0
        ids = (torch.arange(input_ids.shape[-1], device=input_ids.device) + seen).unsqueeze(0)
        if index is not None and index < len(args):
            args = (*args[:index], ids, *args[index + 1:])
        else:
            kwargs = {**kwargs, "position_ids": ids}
        return original(*args, **kwargs)

    parent.forward = sp_position_ids_forward
    parent._hp_position_ids_wrapped = True
    return True
