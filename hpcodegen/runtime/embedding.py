"""Embedding-specific install steps: the vocab-parallel lookup.

* A token embedding (an ``nn.Embedding`` instance, a subclass such as Gemma's scaled word
  embedding, or any class whose name ends in ``Embedding``, defined in the generated file
  or not) whose weight is ``Shard(0)`` on tp holds rows ``[start, end)`` of the vocabulary.
  Its compute (the generated class's ``_forward_impl``, else its ``forward``) is called with
  the ids shifted into the local range, ids outside clamped to its first or last row, and
  the rows of those ids zeroed in its output, so the output is a ``Partial(sum)`` over tp
  which the boundary's output op then reduces. Zeroing the output (not only the looked-up rows)
  keeps any per-token op after the lookup (Gemma's ``* embed_scale``) exact.
* With sequence parallelism the parent ``*Model.forward`` of such an embedding gets global
  default ``position_ids`` and full-length masks: :mod:`hpcodegen.sp_positions`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from torch import nn

from hpcodegen.plan.entry import takes_token_ids
from hpcodegen.runtime.local_views import local_shape
from hpcodegen.runtime.mesh import TP, ActiveMesh
from hpcodegen.runtime.params import ShardedParam


def is_token_embedding(module: nn.Module) -> bool:
    """An ``nn.Embedding`` (any subclass) or a class named ``*Embedding``."""
    return isinstance(module, nn.Embedding) or takes_token_ids(type(module).__name__)


def install_vocab_parallel(module: nn.Module, start: int) -> None:
    """Run the module's compute as the masked lookup of the local vocabulary rows."""
    attr = "_forward_impl" if hasattr(module, "_forward_impl") else "forward"
    compute = getattr(module, attr)
    end = start + local_shape(module.weight)[0]
    last = end - start - 1
    pad = getattr(module, "padding_idx", None)
    if isinstance(pad, int):  # the lookup's padding row, in local numbering (or none here)
        module.padding_idx = pad - start if start <= pad < end else None
    first = next(iter(inspect.signature(compute).parameters), None)

    @functools.wraps(compute)
    def vocab_parallel_forward(*args: Any, **kwargs: Any) -> Any:
        if args:
            ids, rest = args[0], args[1:]
        else:
            ids, rest = kwargs.pop(first), ()
        shifted = ids - start  # 5 ops around the lookup: shift, clamp, compare, mask
        local_ids = shifted.clamp(0, last)
        outside = shifted != local_ids
        out = compute(local_ids, *rest, **kwargs) if args else \
            compute(**{first: local_ids}, **kwargs)
        return out.masked_fill(outside.unsqueeze(-1), 0.0)

    setattr(module, attr, vocab_parallel_forward)
    module._hp_vocab_range = (start, end)


def row_sharded_vocab_start(module: nn.Module, record: ShardedParam | None,
                            active: ActiveMesh) -> int | None:
    """The first vocabulary row this rank holds when ``module`` is a token embedding
    (:func:`is_token_embedding`) whose weight Phase A sharded by rows on tp; else None.
    ``record`` is the weight's :class:`ShardedParam`."""
    if not is_token_embedding(module) or record is None or TP not in active.axes:
        return None
    tp_placement = record.placements[active.axes.index(TP)]
    if tp_placement.is_shard() and getattr(tp_placement, "dim", None) == 0:
        return record.global_offset[0]
    return None


def install_vocab_lookups(model: nn.Module, sharded: Mapping[str, ShardedParam],
                          active: ActiveMesh) -> list[str]:
    """Install the masked lookup on every row-sharded token embedding, wherever its weight
    is planned; returns their FQNs. (verify refuses a plan whose partial output no
    boundary reduces: :mod:`hpcodegen.checks.model`.)"""
    done = []
    for fqn, record in sharded.items():
        owner_fqn, _, name = fqn.rpartition(".")
        if name != "weight":
            continue
        owner = model.get_submodule(owner_fqn) if owner_fqn else model
        start = row_sharded_vocab_start(owner, record, active)
        if start is not None and not hasattr(owner, "_hp_vocab_range"):
            install_vocab_parallel(owner, start)
            done.append(owner_fqn)
    return done
