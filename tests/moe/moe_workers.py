"""Rank workers for the MoE parity tests (spawned gloo ranks; several artifacts per spawn).

Per case: the launch mesh for the artifact (``dp x tp`` with ep carved from dp), the
unsharded transformers model and the model from the artifact's generated classes with the
same weights; the plan is installed on the second; logits, every gradient (router, experts,
shared experts) and ``steps`` AdamW losses are compared with the unsharded model.
"""

from __future__ import annotations

import json
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
    import torch.nn.functional as F

    from hpcodegen.artifact.load import load_meta
    from hpcodegen.checkpoint.layout import ShardLayout, global_shapes
    from hpcodegen.hf import load_transformers_config, model_class_for
    from hpcodegen.launch.mesh import build_device_mesh, resolve_mesh_layout
    from hpcodegen.launch.parity import full_logits, max_param_diff
    from hpcodegen.runtime import MeshContext, parallelize_from_generated
    from hpcodegen.runtime.experts import resolve_expert_mesh
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module
    from hpcodegen.runtime.mesh import resolve_active_mesh

    config_dict = json.loads(Path(model_dir, "config.json").read_text())
    meta = load_meta(Path(artifact)).data
    mesh = build_device_mesh(resolve_mesh_layout(meta, dist.get_world_size()), "cpu")
    config = load_transformers_config(config_dict)
    torch.manual_seed(0)
    ref = model_class_for(config_dict)(config).float().eval()
    with torch.no_grad():  # zero-initialised biases would hide a bias added once per rank
        for param in ref.parameters():
            if not param.any():
                param.normal_(0.0, 0.02)
    gen = generated_model_class(meta, import_generated_module(Path(artifact)))(config)
    gen = gen.float().eval()
    gen.load_state_dict(ref.state_dict())
    ref_start = copy.deepcopy(ref)
    context = MeshContext(device_mesh=mesh)
    shapes = global_shapes(gen)
    info = parallelize_from_generated(gen, context, artifact, hf_config=config_dict)
    layout = ShardLayout.from_model(gen, shapes, info)
    active = resolve_active_mesh(meta, context)
    expert = resolve_expert_mesh(meta, mesh)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config_dict["vocab_size"], (BATCH, SEQ + 1), generator=g)
    inputs, labels = ids[:, :-1], ids[:, 1:]

    def loss_of(model: Any, act: Any) -> tuple[Any, Any]:
        logits = model(input_ids=inputs).logits
        if act is not None:
            logits = full_logits(logits, model, meta, act)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()), logits

    loss, logits = loss_of(gen, active)
    loss.backward()
    ref_loss, ref_logits = loss_of(ref, None)
    ref_loss.backward()
    grad, worst, odd = max_param_diff(gen, ref, meta, active, lambda p: p.grad, expert)
    routed = [n for n, p in gen.named_parameters() if p.grad is not None]
    out = {"logits": float((logits - ref_logits).abs().max()), "grad": grad, "worst": worst,
           "odd": odd, "with_grad": len(routed), "params": len(list(gen.parameters()))}
    out["expert_split"] = expert_split(gen, meta, shapes)
    out |= clip_result(gen, ref, layout, meta, active, expert)
    losses: list[float] = []
    ref_losses: list[float] = []
    ref = ref_start
    gen.zero_grad(set_to_none=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-6) for m in (gen, ref)]
    for _ in range(steps):
        for model, act, opt, sink in ((gen, active, opts[0], losses),
                                      (ref, None, opts[1], ref_losses)):
            opt.zero_grad(set_to_none=True)
            step_loss, _ = loss_of(model, act)
            step_loss.backward()
            opt.step()
            sink.append(float(step_loss))
    out["loss_diff"] = max((abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
                           default=0.0)
    return out


def expert_split(gen: Any, meta: Any, shapes: dict[str, Any]) -> list[int]:
    """How many ways the expert dimension of each expert parameter (an ``ep`` placement) is
    split on this rank: ``[ep]`` when every rank holds ``E/ep`` experts."""
    from hpcodegen.launch.parity import plan_placements

    placements = plan_placements(meta)
    split = set()
    for fqn, param in gen.named_parameters():
        named = placements.get(fqn)
        if isinstance(named, Mapping) and "ep" in named:
            local = param.to_local() if hasattr(param, "to_local") else param
            split.add(int(shapes[fqn][0]) // int(local.shape[0]))
    return sorted(split)


def clip_result(gen: Any, ref: Any, layout: Any, meta: Any, active: Any,
                expert: Any) -> dict[str, Any]:
    """Global-norm clipping on the sharded model vs torch's on the unsharded one (both hold
    their gradients): relative norm errors for p = 2, inf and 3, then the clipped gradients'
    max diff and the clip coefficient."""
    import math

    import torch

    from hpcodegen.checkpoint.clip import clip_grad_norm_, total_grad_norm
    from hpcodegen.launch.parity import max_param_diff

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
    out["clip_grad"] = max_param_diff(gen, ref, meta, active, lambda p: p.grad, expert)[0]
    return out


def parity_cases(cases: Sequence[tuple[str, str, str, int]]) -> dict[str, Any]:
    """``{name: result}`` for ``(name, artifact dir, model dir, steps)`` cases, one spawn."""
    import torch

    torch.set_num_threads(1)
    return {name: case_result(artifact, model_dir, steps)
            for name, artifact, model_dir, steps in cases}
