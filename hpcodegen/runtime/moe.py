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

The payload collectives are differentiable (their backward is the reverse all_to_all), so
a layer costs 3 all_to_alls forward and 2 backward: :mod:`hpcodegen.plan.moe` states
this and the bytes, ``hpcodegen.plan.predict`` counts exactly these. With an ep group of 1
the module's forward runs unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

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
    sizes = {p.shape[0] for _, p in module.named_parameters(recurse=False) if p.dim() >= 2}
    if len(sizes) != 1:
        raise ValueError(f"{type(module).__name__}: expert parameters disagree on the expert "
                         f"count {sorted(sizes)}")
    return sizes.pop()


def _divide_counts(module: nn.Module, total: int, local: int) -> None:
    for name in EXPERT_COUNT_ATTRS:
        if getattr(module, name, None) == total:
            setattr(module, name, local)


def ep_dispatch(module: nn.Module, **_options: Any) -> Callable[..., Any]:
    """The local compute of an expert-parallel ``experts`` region (see module docstring).

    The runtime binds ``module._hp_expert_parallel`` (group, size, rank) before calling
    this; without it (no ep axis live) the module's own forward is returned.
    """
    forward = type(module).forward.__get__(module)  # the class's, not the boundary wrapper
    ep = getattr(module, "_hp_expert_parallel", None)
    if ep is None or ep.size <= 1:
        return forward
    local = _local_experts(module)
    total = local * ep.size
    _divide_counts(module, total, local)
    names = [p.name for p in list(inspect.signature(forward).parameters.values())[:3]]
    sig = inspect.signature(forward)
    group = ep.group

    def ep_compute(*args: Any, **kwargs: Any) -> torch.Tensor:
        bound = sig.bind(*args, **kwargs)
        hidden, index, weights = (bound.arguments[n] for n in names)
        tokens, k = index.shape[0], index.shape[-1]
        flat = index.reshape(-1)
        order = torch.sort(flat, stable=True).indices
        experts = flat[order]
        token_of = torch.div(order, k, rounding_mode="floor")
        per_expert = torch.bincount(experts, minlength=total)
        recv_per_expert = _counts_a2a(per_expert, group)          # [ep * local]
        send = per_expert.view(ep.size, local).sum(1).tolist()
        recv_matrix = recv_per_expert.view(ep.size, local)
        recv = recv_matrix.sum(1).tolist()
        x = _a2a(hidden[token_of], send, recv, group)
        local_ids = torch.repeat_interleave(
            torch.arange(local, device=flat.device).repeat(ep.size), recv_matrix.reshape(-1))
        ones = torch.ones((x.shape[0], 1), dtype=weights.dtype, device=weights.device)
        y = forward(x, local_ids[:, None], ones)
        if x.shape[0] == 0:  # no slot arrived: keep the local experts in the graph
            y = y + sum(p.sum() * 0 for p in module.parameters(recurse=False))
        back = _a2a(y, recv, send, group)
        scaled = back * weights.reshape(-1)[order, None].to(back.dtype)
        out = torch.zeros((tokens, hidden.shape[-1]), dtype=hidden.dtype, device=hidden.device)
        return out.index_add(0, token_of, scaled.to(hidden.dtype))

    return ep_compute
