"""Rank workers of tests/runtime/test_dtensor_params.py: a parallelized model's DTensor
parameters used by torch's own tools, each answer measured against the unsharded model."""

from __future__ import annotations

from typing import Any

from rt_workers import BATCH, EPS, EXAMPLES, LR, SEQ, _pair, batch, build_pair, hf_config, loss_of

MAX_NORM = 0.05  # under the gradient norm of the example batch: the clip scales


def _max_diff(a: Any, b: Any) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0


def _planned_placements(plan: Any, param: Any, fqn: str, axes: tuple[str, ...]) -> tuple:
    from hpcodegen.placement import resolve_placements
    from hpcodegen.runtime.mesh import to_torch_placements

    named = {p.fqn: p.placements for p in plan.parameters()}.get(fqn, {})
    return to_torch_placements(resolve_placements(named, axes), param.dim())


def _grads_diff(gen: Any, ref: Any) -> tuple[float, str]:
    refs = dict(ref.named_parameters())
    worst, where = 0.0, ""
    for fqn, param in gen.named_parameters():
        diff = _max_diff(param.grad.full_tensor(), refs[fqn].grad)
        if diff >= worst:
            worst, where = diff, fqn
    return worst, where


def _params_diff(gen: Any, ref: Any) -> float:
    refs = dict(ref.named_parameters())
    return max(_max_diff(p.full_tensor(), refs[f]) for f, p in gen.named_parameters())


def dcp_round_trip(gen: Any, checkpoint_dir: str, logits_of: Any, after: Any) -> float:
    """``get_model_state_dict`` saved with DCP, the parameters zeroed, loaded back and set:
    the largest logit difference from ``after`` (0 when the round trip restores them)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    dcp.save(get_model_state_dict(gen), checkpoint_id=checkpoint_dir)
    with torch.no_grad():
        for p in gen.parameters():
            p.zero_()
    state = get_model_state_dict(gen)
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_model_state_dict(gen, state)
    with torch.no_grad():
        return _max_diff(logits_of(gen), after)


def torch_tools(artifact: str, checkpoint_dir: str) -> dict[str, Any]:
    """On a 1-D tp mesh: placements, logits, every gradient, torch's clip, an AdamW step and
    a DCP round trip of ``get_model_state_dict``, each against the unsharded model."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from hpcodegen.parity.gather import full_logits
    from hpcodegen.parity.harness import install

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    pair = _pair(artifact)
    installed = install(pair, mesh)
    gen, ref, plan = pair.sharded, pair.reference, pair.plan
    impl = {f: p._cdata for f, p in gen.named_parameters()}
    gen.to("cpu")  # swap_tensors on DTensor parameters: the gradient hooks must follow
    swapped = sum(impl[f] != p._cdata for f, p in gen.named_parameters())
    wrong = [fqn for fqn, p in gen.named_parameters() if not isinstance(p, DTensor)
             or tuple(p.placements) != _planned_placements(plan, p, fqn, ("tp",))]
    sharded = sum(1 for p in gen.parameters() if isinstance(p, DTensor)
                  and any(q.is_shard() for q in p.placements))
    ids, labels = batch(ref.config.vocab_size)

    def logits_of(model: Any) -> Any:
        return full_logits(model(input_ids=ids, use_cache=False).logits, model, plan,
                           installed.active)

    ref_logits = ref(input_ids=ids, use_cache=False).logits
    logits = logits_of(gen)
    loss_of(ref_logits, labels).backward()
    loss_of(logits, labels).backward()
    grad, grad_name = _grads_diff(gen, ref)
    norm_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
    norm = torch.nn.utils.clip_grad_norm_(gen.parameters(), MAX_NORM)
    norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
    p_grad = {f: float(p.grad.norm().full_tensor() if isinstance(p.grad.norm(), DTensor)
                       else p.grad.norm()) for f, p in gen.named_parameters()}
    p_grad_diff = max(abs(p_grad[f] - float(q.grad.norm())) / max(float(q.grad.norm()), 1e-12)
                      for f, q in ref.named_parameters())
    clipped, _ = _grads_diff(gen, ref)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS)
    opt = torch.optim.AdamW(gen.parameters(), lr=LR, eps=EPS)
    opt_ref.step()
    opt.step()
    step = _params_diff(gen, ref)
    with torch.no_grad():
        after = logits_of(gen)
    restored = dcp_round_trip(gen, checkpoint_dir, logits_of, after)
    return {"wrong_placements": wrong, "sharded": sharded, "swapped": swapped,
            "logits": _max_diff(logits, ref_logits), "grad": grad, "grad_name": grad_name,
            "norm": float(norm), "norm_ref": float(norm_ref), "p_grad_norm": p_grad_diff,
            "clipped": clipped, "step": step, "restored": restored}


def fsdp_tools(artifact: str) -> dict[str, Any]:
    """FSDP2 ``fully_shard`` over dp of a (dp=2, tp=2) mesh on the DTensor parameters, torch's
    clip and AdamW, against one process on the whole batch."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from hpcodegen.parity.harness import token_batch
    from hpcodegen.runtime import MeshContext, parallelize_from_generated

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh.size(0)
    ref, gen = build_pair(artifact)
    parallelize_from_generated(gen, MeshContext(mesh), EXAMPLES / artifact,
                               hf_config=hf_config(artifact))
    for layer in gen.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(gen, mesh=mesh["dp"])
    on_2d = all(isinstance(p, DTensor) and p.device_mesh.mesh_dim_names == ("dp", "tp")
                for p in gen.parameters())
    ids, labels = token_batch(ref.config.vocab_size, dp * BATCH, SEQ)
    r = mesh.get_local_rank("dp")
    rows = slice(r * BATCH, (r + 1) * BATCH)
    loss_of(ref(input_ids=ids, use_cache=False).logits, labels).backward()
    loss_of(gen(input_ids=ids[rows], use_cache=False).logits, labels[rows]).backward()
    grad, grad_name = _grads_diff(gen, ref)
    norm_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
    norm = torch.nn.utils.clip_grad_norm_(gen.parameters(), MAX_NORM)
    norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
    torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS).step()
    torch.optim.AdamW(gen.parameters(), lr=LR, eps=EPS).step()
    return {"on_2d": on_2d, "grad": grad, "grad_name": grad_name, "norm": float(norm),
            "norm_ref": float(norm_ref), "step": _params_diff(gen, ref)}
