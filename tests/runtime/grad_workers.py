"""Rank worker of the flattened partial-gradient sync tests (spawned gloo ranks).

Two backwards on two batches without zeroing the gradients (gradient accumulation), then
logits and every accumulated gradient against the unsharded model; also how many
collectives the second backward ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def accumulate_case(artifact: str, model_dir: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.tensor.debug import CommDebugMode

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
    with torch.no_grad():  # norms start at ones: make every partial gradient distinct
        for param in ref.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    gen = generated_model_class(meta, import_generated_module(Path(artifact)))(config).float()
    gen.load_state_dict(ref.state_dict())
    context = MeshContext(device_mesh=mesh)
    parallelize_from_generated(gen, context, artifact, hf_config=config_dict)
    active = resolve_active_mesh(meta, context)
    g = torch.Generator().manual_seed(1)
    vocab = config_dict["vocab_size"]
    counts = []
    worst_logits = 0.0
    for _ in range(2):  # accumulate two micro-batches
        ids = torch.randint(0, vocab, (2, 9), generator=g)
        inputs, labels = ids[:, :-1], ids[:, 1:]
        logits = full_logits(gen(input_ids=inputs).logits, gen, meta, active)
        ref_logits = ref(input_ids=inputs).logits
        worst_logits = max(worst_logits, float((logits - ref_logits).abs().max()))
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        with CommDebugMode() as mode:
            loss.backward()
        counts.append(sum(mode.get_comm_counts().values()))
        F.cross_entropy(ref_logits.flatten(0, 1), labels.flatten()).backward()
    grad, worst, odd = max_param_diff(gen, ref, meta, active, lambda p: p.grad)
    return {"logits": worst_logits, "grad": grad, "worst": worst, "odd": odd,
            "counts": counts}
