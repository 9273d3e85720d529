"""hpcodegen's expert-parallel dispatch: the ``local_compute_fn`` factory of MoE regions.

``ep_dispatch(module)`` is bound on an ``experts`` module (HF 5.x: ``forward(hidden_states,
top_k_index, top_k_weights)`` over packed ``[E, ...]`` weights) whose expert parameters the
runtime sharded over the ep group (each rank holds ``E/ep`` consecutive experts). The
compute it returns is dropless and exact:

1. every (token, k) slot is sorted by its expert (stable, so ties keep token order);
2. ``all_to_all`` #1 exchanges the per-expert slot counts (int64, ``E`` per rank);
3. ``all_to_all`` #2 sends each slot's hidden state to the rank owning its expert;
4. the module's own forward (eager or grouped_mm, as transformers picks) runs the local
   experts on what arrived, each slot with routing weight 1 (``x * 1`` is exact);
5. ``all_to_all`` #3 returns the results, which are scaled by the routing weight at home
   and summed per token in expert order, as the unsharded forward does.

Under sequence parallelism with experts split over tp (``_hp_expert_tp``), every tp rank
routed its own slice of the tokens: after step 3 the rows the tp peers received are
gathered (their counts first), the experts compute their tp shard of every gathered row,
and the partial results are summed back onto the rank that received them (an uneven
reduce-scatter) before step 5: Megatron's all-to-all dispatcher with expert tensor
parallelism.

The payload collectives are differentiable (their backward is the reverse all_to_all), so
a layer costs 3 all_to_alls forward and 2 backward (plus the tp gather's all_gather and 2
all_to_alls forward, 2 backward): :mod:`hpcodegen.plan.moe` states this and the bytes,
``hpcodegen.plan.predict`` counts exactly these. With neither an ep group nor a tp gather
the module's forward runs unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpcodegen.runtime.local_views import local_shape

#: attributes of an experts module holding the global expert count (divided by ep)
EXPERT_COUNT_ATTRS: tuple[str, ...] = ("num_experts", "num_local_experts", "n_routed_experts")


def _a2a(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` (backward: the reverse exchange)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x.contiguous(), recv, send, group))


def _counts_a2a(counts: torch.Tensor, group: Any) -> torch.Tensor:
    import torch.distributed as dist

    out = counts.clone()  # overwritten; a fake process group leaves it as sent
    dist.all_to_all_single(out, counts, group=group)
    return out


def _local_experts(module: nn.Module) -> int:
    sizes = {local_shape(p)[0] for _, p in module.named_parameters(recurse=False)
             if p.dim() >= 2}
    if len(sizes) != 1:
        raise ValueError(f"{type(module).__name__}: expert parameters disagree on the expert "
                         f"count {sorted(sizes)}")
    return sizes.pop()


def _divide_counts(module: nn.Module, total: int, local: int) -> None:
    for name in EXPERT_COUNT_ATTRS:
        if getattr(module, name, None) == total:
            setattr(module, name, local)


def _gather_rows(x: torch.Tensor, sizes: list[int], group: Any) -> torch.Tensor:
    """Every tp rank's rows, concatenated rank-major (``sizes[j]`` rows from rank ``j``).

    Uneven sizes (gloo has no uneven all_gather), so an ``all_to_all_single`` that sends
    this rank's rows to every peer; its backward returns each peer's gradient of these rows,
    summed by ``repeat``'s backward: the reduce-scatter of the partial gradients."""
    n = x.shape[0]
    return _a2a(x.repeat(len(sizes), 1), [n] * len(sizes), sizes, group)


def _scatter_rows(y: torch.Tensor, sizes: list[int], rank: int, group: Any) -> torch.Tensor:
    """This rank's rows of ``y`` (rank-major, ``sizes[j]`` rows each) summed over the tp
    ranks' partial results: a reduce-scatter with uneven sizes, as an ``all_to_all_single``
    followed by a local sum."""
    n = sizes[rank]
    got = _a2a(y, sizes, [n] * len(sizes), group)
    return got.view(len(sizes), n, *y.shape[1:]).sum(0)


def _tp_counts(counts: torch.Tensor, gather: TokenGather) -> torch.Tensor:
    """Every tp rank's per-(source, expert) row counts, ``[tp, len(counts)]`` (int64)."""
    import torch.distributed as dist

    out = counts.repeat(gather.size)  # overwritten; a fake process group leaves it as sent
    dist.all_gather_into_tensor(out, counts, group=gather.group)
    return out.view(gather.size, -1)


@dataclass(frozen=True)
class TokenGather:
    """The tp group a dispatch gathers its rows over (sequence parallelism with experts
    split over tp: each tp rank routed its own slice of the tokens)."""

    group: Any
    size: int
    rank: int


def ep_dispatch(module: nn.Module, **_options: Any) -> Callable[..., Any]:
    """The local compute of an expert-parallel ``experts`` region (see module docstring).

    The runtime binds ``module._hp_expert_parallel`` (ep group, size, rank) and, when the
    tokens arrive sharded on tp while the experts are split over tp (sequence parallelism),
    ``module._hp_expert_tp`` (:class:`TokenGather`) before calling this; with neither, the
    module's own forward is returned.
    """
    forward = type(module).forward.__get__(module)  # the class's, not the boundary wrapper
    ep = getattr(module, "_hp_expert_parallel", None)
    gather = getattr(module, "_hp_expert_tp", None)
    ep = ep if ep is not None and ep.size > 1 else None
    if ep is None and gather is None:
        return forward
    local = _local_experts(module)
    ep_size = ep.size if ep is not None else 1
    total = local * ep_size
    _divide_counts(module, total, local)
    sig = inspect.signature(forward)
    names = [p.name for p in list(sig.parameters.values())[:3]]

    def ep_compute(*args: Any, **kwargs: Any) -> torch.Tensor:
        bound = sig.bind(*args, **kwargs)
        hidden, index, weights = (bound.arguments[n] for n in names)
        tokens, k = index.shape[0], index.shape[-1]
        flat = index.reshape(-1)
        order = torch.sort(flat, stable=True).indices
        token_of = torch.div(order, k, rounding_mode="floor")
        per_expert = torch.bincount(flat[order], minlength=total)
        x, counts, send, recv = hidden[token_of], per_expert, None, None
        if ep is not None:
            counts = _counts_a2a(per_expert, ep.group)            # [ep * local]
            send = per_expert.view(ep_size, local).sum(1).tolist()
            recv = counts.view(ep_size, local).sum(1).tolist()
            x = _a2a(x, send, recv, ep.group)
        sizes = None
        if gather is not None:
            every = _tp_counts(counts, gather)                    # [tp, ep * local]
            sizes = every.sum(1).tolist()
            x = _gather_rows(x, sizes, gather.group)
            counts = every.reshape(-1)
        local_ids = torch.repeat_interleave(
            torch.arange(local, device=flat.device).repeat(counts.numel() // local), counts)
        ones = torch.ones((x.shape[0], 1), dtype=weights.dtype, device=weights.device)
        y = forward(x, local_ids[:, None], ones)
        if x.shape[0] == 0:  # no slot arrived: keep the local experts in the graph
            y = y + sum(p.sum() * 0 for p in module.parameters(recurse=False))
        if sizes is not None:
            y = _scatter_rows(y, sizes, gather.rank, gather.group)
        back = _a2a(y, recv, send, ep.group) if ep is not None else y
        scaled = back * weights.reshape(-1)[order, None].to(back.dtype)
        out = torch.zeros((tokens, hidden.shape[-1]), dtype=hidden.dtype, device=hidden.device)
        return out.index_add(0, token_of, scaled.to(hidden.dtype))

    return ep_compute
