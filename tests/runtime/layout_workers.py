"""Rank worker for a composite model's vision tower split over tp (spawned gloo ranks):
logits and every gradient against the unsharded model on a batch with images."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def image_case(artifact: str, model_dir: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from hpcodegen.artifact.load import load_meta
    from hpcodegen.hf import load_transformers_config, model_class_for
    from hpcodegen.launch.mesh import build_device_mesh, resolve_mesh_layout
    from hpcodegen.launch.parity import full_logits, max_param_diff
    from hpcodegen.runtime import MeshContext, parallelize_from_generated
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module
    from hpcodegen.runtime.mesh import resolve_active_mesh

    torch.set_num_threads(1)
    config_dict = json.loads(Path(model_dir, "config.json").read_text())
    meta = load_meta(Path(artifact)).data
    mesh = build_device_mesh(resolve_mesh_layout(meta, dist.get_world_size()), "cpu")
    config = load_transformers_config(config_dict)
    torch.manual_seed(0)
    ref = model_class_for(config_dict)(config).float()
    with torch.no_grad():  # zero-initialised biases would hide a bias added once per rank
        for param in ref.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    gen = generated_model_class(meta, import_generated_module(Path(artifact)))(config).float()
    gen.load_state_dict(ref.state_dict())
    context = MeshContext(device_mesh=mesh)
    parallelize_from_generated(gen, context, artifact, hf_config=config_dict)
    active = resolve_active_mesh(meta, context)
    g = torch.Generator().manual_seed(1)
    vision = config_dict["vision_config"]
    pixels = torch.randn(2, 3, vision["image_size"], vision["image_size"], generator=g)
    image = [config_dict["boi_token_index"]] + [config_dict["image_token_index"]] \
        * config_dict["mm_tokens_per_image"] + [config_dict["eoi_token_index"]]
    text = torch.randint(0, 200, (2, 4), generator=g)
    ids = torch.cat([text, torch.tensor([image, image]), text], dim=1)
    logits = full_logits(gen(input_ids=ids, pixel_values=pixels).logits, gen, meta, active)
    ref_logits = ref(input_ids=ids, pixel_values=pixels).logits
    logits.float().pow(2).mean().backward()
    ref_logits.float().pow(2).mean().backward()
    grad, worst, odd = max_param_diff(gen, ref, meta, active, lambda p: p.grad)
    vision_grads = sum(1 for n, p in gen.named_parameters()
                       if "vision_tower" in n and p.grad is not None)
    return {"logits": float((logits - ref_logits).abs().max()), "grad": grad, "worst": worst,
            "odd": odd, "vision_grads": vision_grads}
