"""Rank worker of the flattened partial-gradient sync tests (spawned gloo ranks).

Two backwards on two batches without zeroing the gradients (gradient accumulation), then
logits and every accumulated gradient against the unsharded model; also how many
collectives the second backward ran.
"""

from __future__ import annotations

from typing import Any


def accumulate_case(artifact: str, model_dir: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.launch.rank.mesh import build_device_mesh, resolve_mesh_layout
    from hpcodegen.parity.gather import full_logits, max_param_diff
    from hpcodegen.parity.harness import build_pair, install, read_config

    torch.set_num_threads(1)
    config_dict = read_config(model_dir)

    def perturb(ref: Any) -> None:  # norms start at ones: make every partial gradient distinct
        for param in ref.parameters():
            param.add_(torch.randn_like(param) * 0.02)

    pair = build_pair(artifact, config_dict, eval_mode=False, prepare=perturb)
    plan, ref, gen = pair.plan, pair.reference, pair.sharded
    mesh = build_device_mesh(resolve_mesh_layout(plan, dist.get_world_size()), "cpu")
    active = install(pair, mesh).active
    g = torch.Generator().manual_seed(1)
    vocab = config_dict["vocab_size"]
    counts = []
    worst_logits = 0.0
    for _ in range(2):  # accumulate two micro-batches
        ids = torch.randint(0, vocab, (2, 9), generator=g)
        inputs, labels = ids[:, :-1], ids[:, 1:]
        logits = full_logits(gen(input_ids=inputs).logits, gen, plan, active)
        ref_logits = ref(input_ids=inputs).logits
        worst_logits = max(worst_logits, float((logits - ref_logits).abs().max()))
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        with CommDebugMode() as mode:
            loss.backward()
        counts.append(sum(mode.get_comm_counts().values()))
        F.cross_entropy(ref_logits.flatten(0, 1), labels.flatten()).backward()
    grad, worst, odd = max_param_diff(gen, ref, plan, active, lambda p: p.grad)
    return {"logits": worst_logits, "grad": grad, "worst": worst, "odd": odd,
            "counts": counts}
