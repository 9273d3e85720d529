"""Rank worker for a composite model's vision tower split over tp (spawned gloo ranks):
logits and every gradient against the unsharded model on a batch with images."""

from __future__ import annotations

from typing import Any


def image_case(artifact: str, model_dir: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from hpcodegen.launch.rank.mesh import build_device_mesh, resolve_mesh_layout
    from hpcodegen.parity.gather import full_logits, max_param_diff
    from hpcodegen.parity.harness import build_pair, install, read_config

    torch.set_num_threads(1)
    config_dict = read_config(model_dir)

    def perturb(ref: Any) -> None:  # zero-initialised biases would hide a bias added once per rank
        for param in ref.parameters():
            param.add_(torch.randn_like(param) * 0.02)

    pair = build_pair(artifact, config_dict, eval_mode=False, prepare=perturb)
    plan, ref, gen = pair.plan, pair.reference, pair.sharded
    mesh = build_device_mesh(resolve_mesh_layout(plan, dist.get_world_size()), "cpu")
    active = install(pair, mesh).active
    g = torch.Generator().manual_seed(1)
    vision = config_dict["vision_config"]
    pixels = torch.randn(2, 3, vision["image_size"], vision["image_size"], generator=g)
    image = [config_dict["boi_token_index"]] + [config_dict["image_token_index"]] \
        * config_dict["mm_tokens_per_image"] + [config_dict["eoi_token_index"]]
    text = torch.randint(0, 200, (2, 4), generator=g)
    ids = torch.cat([text, torch.tensor([image, image]), text], dim=1)
    logits = full_logits(gen(input_ids=ids, pixel_values=pixels).logits, gen, plan, active)
    ref_logits = ref(input_ids=ids, pixel_values=pixels).logits
    logits.float().pow(2).mean().backward()
    ref_logits.float().pow(2).mean().backward()
    grad, worst, odd = max_param_diff(gen, ref, plan, active, lambda p: p.grad)
    vision_grads = sum(1 for n, p in gen.named_parameters()
                       if "vision_tower" in n and p.grad is not None)
    return {"logits": float((logits - ref_logits).abs().max()), "grad": grad, "worst": worst,
            "odd": odd, "vision_grads": vision_grads}
