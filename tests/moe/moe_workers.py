"""Rank workers for the MoE parity tests (spawned gloo ranks; several artifacts per spawn).

Per case: the launch mesh for the artifact (``dp x tp`` with ep carved from dp) and the
library's parity harness (:mod:`hpcodegen.parity.harness`): the unsharded transformers
model and the artifact's generated classes with the same weights, the plan installed on
the second, logits and every gradient (router, experts, shared experts, over the expert
mesh) compared; then global-norm clipping and ``steps`` AdamW losses.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

BATCH, SEQ = 2, 8


def case_result(artifact: str, model_dir: str, steps: int) -> dict[str, Any]:
    import copy

    import torch
    import torch.distributed as dist

    from hpcodegen.checkpoint.layout import ShardLayout, global_shapes
    from hpcodegen.launch.rank.mesh import build_device_mesh, resolve_mesh_layout
    from hpcodegen.parity.harness import (
        build_pair,
        compare,
        install,
        loss_and_logits,
        read_config,
        token_batch,
    )

    def nonzero(ref: Any) -> None:  # zero-initialised biases would hide a bias added per rank
        for param in ref.parameters():
            if not param.any():
                param.normal_(0.0, 0.02)

    config_dict = read_config(model_dir)
    pair = build_pair(artifact, config_dict, prepare=nonzero)
    plan, gen = pair.plan, pair.sharded
    mesh = build_device_mesh(resolve_mesh_layout(plan, dist.get_world_size()), "cpu")
    ref_start = copy.deepcopy(pair.reference)
    shapes = global_shapes(gen)
    installed = install(pair, mesh)
    layout = ShardLayout.from_model(gen, shapes, installed.info)
    inputs, labels = token_batch(config_dict["vocab_size"], BATCH, SEQ)
    result = compare(gen, pair.reference, plan, installed, {"input_ids": inputs}, labels)
    routed = [n for n, p in gen.named_parameters() if p.grad is not None]
    out = {"logits": result.logits, "grad": result.grad, "worst": result.worst,
           "odd": result.odd, "with_grad": len(routed), "params": len(list(gen.parameters()))}
    out["expert_split"] = expert_split(gen, plan, shapes)
    out |= clip_result(gen, pair.reference, layout, plan, installed.active, installed.expert)
    losses: list[float] = []
    ref_losses: list[float] = []
    gen.zero_grad(set_to_none=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-6) for m in (gen, ref_start)]
    for _ in range(steps):
        for model, act, opt, sink in ((gen, installed.active, opts[0], losses),
                                      (ref_start, None, opts[1], ref_losses)):
            opt.zero_grad(set_to_none=True)
            step_loss, _ = loss_and_logits(model, {"input_ids": inputs}, labels, plan, act)
            step_loss.backward()
            opt.step()
            sink.append(float(step_loss))
    out["loss_diff"] = max((abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
                           default=0.0)
    return out


def expert_split(gen: Any, plan: Any, shapes: dict[str, Any]) -> list[int]:
    """How many ways the expert dimension of each expert parameter (an ``ep`` placement) is
    split on this rank: ``[ep]`` when every rank holds ``E/ep`` experts."""
    from hpcodegen.parity.gather import plan_placements

    placements = plan_placements(plan)
    split = set()
    for fqn, param in gen.named_parameters():
        named = placements.get(fqn)
        if isinstance(named, Mapping) and "ep" in named:
            local = param.to_local() if hasattr(param, "to_local") else param
            split.add(int(shapes[fqn][0]) // int(local.shape[0]))
    return sorted(split)


def clip_result(gen: Any, ref: Any, layout: Any, plan: Any, active: Any,
                expert: Any) -> dict[str, Any]:
    """Global-norm clipping on the sharded model vs torch's on the unsharded one (both hold
    their gradients): relative norm errors for p = 2, inf and 3, then the clipped gradients'
    max diff and the clip coefficient."""
    import math

    import torch

    from hpcodegen.checkpoint.clip import clip_grad_norm_, total_grad_norm
    from hpcodegen.parity.gather import max_param_diff

    grads = [p.grad for p in ref.parameters() if p.grad is not None]
    out: dict[str, Any] = {}
    for name, p in (("2", 2.0), ("inf", math.inf), ("3", 3.0)):
        want = float(torch.nn.utils.get_total_norm(grads, p))
        out[f"norm_rel_{name}"] = abs(float(total_grad_norm(gen, p, layout=layout)) - want) / want
    want = float(torch.nn.utils.get_total_norm(grads, 2.0))
    max_norm = 0.25 * want  # clipping is active: every gradient is scaled by ~0.25
    got = float(clip_grad_norm_(gen, max_norm, layout=layout))
    ref_got = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm))
    out["clip_norm_rel"] = abs(got - ref_got) / ref_got
    out["clip_coef"] = max_norm / (ref_got + 1e-6)
    out["clip_grad"] = max_param_diff(gen, ref, plan, active, lambda p: p.grad, expert)[0]
    return out


def parity_cases(cases: Sequence[tuple[str, str, str, int]]) -> dict[str, Any]:
    """``{name: result}`` for ``(name, artifact dir, model dir, steps)`` cases, one spawn."""
    import torch

    torch.set_num_threads(1)
    return {name: case_result(artifact, model_dir, steps)
            for name, artifact, model_dir, steps in cases}
