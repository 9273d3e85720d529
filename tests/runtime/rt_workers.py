"""Rank workers for the runtime tests (spawned processes; real gloo ranks or the fake PG).

Thin callers of the library's parity harness (:mod:`hpcodegen.parity.harness`: the pair
with the same weights, the install, the comparison) and its spawn helper
(:mod:`hpcodegen.parity.ranks`), with the example artifacts' configs and batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CONFIGS = {"llama": "llama", "llama_bias": "llama_bias", "qwen3": "qwen3"}
BATCH, SEQ = 2, 8
LR = 1e-3
#: first-step Adam updates are ~lr*sign(grad): a larger eps keeps fp32 roundoff of
#: near-zero gradients from being amplified to the update size
EPS = 1e-6


def config_name(artifact: str) -> str:
    return artifact.rsplit("_tp", 1)[0]


def hf_config(artifact: str) -> dict[str, Any]:
    path = EXAMPLES / "configs" / config_name(artifact) / "config.json"
    return json.loads(path.read_text())


def build_pair(artifact: str, seed: int = 0) -> tuple[Any, Any]:
    """(unsharded transformers model, model from the generated classes), same weights."""
    pair = _pair(artifact, seed=seed)
    return pair.reference, pair.sharded


def _pair(artifact: str, **kwargs: Any) -> Any:
    from hpcodegen.parity.harness import build_pair as harness_pair

    return harness_pair(EXAMPLES / artifact, hf_config(artifact), eval_mode=False,
                        attn_implementation="sdpa", **kwargs)


def batch(vocab: int, seed: int = 1) -> tuple[Any, Any]:
    """Token ids and next-token labels (seeded, the same on every rank)."""
    from hpcodegen.parity.harness import token_batch

    return token_batch(vocab, BATCH, SEQ, seed)


def loss_of(logits: Any, labels: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def compare(artifact: str, mesh: Any) -> dict[str, float]:
    """Install the artifact on a fresh model, run forward+backward, return max diffs.

    The harness's comparison (gradients gathered by the plan's placements) and, as strict,
    the reference gradient cut to this rank's shard by the returned source info (which
    checks the placements the runtime reports): ``grad`` is the worse of the two.
    ``artifact`` may end in ``:plain``: the model is then built from the transformers
    classes instead of the generated ones (``:dtensor``: also every transition through
    ``DTensor.redistribute``).
    """
    from hpcodegen.parity.gather import max_shard_diff
    from hpcodegen.parity.harness import compare as harness_compare
    from hpcodegen.parity.harness import install

    artifact, _, variant = artifact.partition(":")
    pair = _pair(artifact, plain=variant in ("plain", "dtensor"))
    if variant == "dtensor":  # every transition through DTensor.redistribute, none lowered
        import hpcodegen.runtime.generic as generic

        lowered, generic.transition_fn = generic.transition_fn, generic.dtensor_fn
    try:
        installed = install(pair, mesh)
    finally:
        if variant == "dtensor":
            generic.transition_fn = lowered
    ids, labels = batch(pair.reference.config.vocab_size)
    # default use_cache: a DynamicCache is built
    result = harness_compare(pair.sharded, pair.reference, pair.plan, installed,
                             {"input_ids": ids}, labels)
    ref_grads = {n: q.grad for n, q in pair.reference.named_parameters()}
    shard, shard_name = max_shard_diff(pair.sharded, ref_grads, installed.info,
                                       lambda q: q.grad)
    worst, name = max((result.grad, result.worst or ""), (shard, shard_name))
    assert not result.odd, result.odd
    return {"logits": result.logits, "grad_scale": result.grad_scale, "grad": worst,
            "grad_name": name}


def parity_many(artifacts: Sequence[str], tp: int) -> dict[str, Any]:
    """Parity of several artifacts on one 1-D tp mesh (one process start for all)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    return {a: compare(a, mesh) for a in artifacts}


def fsdp_many(artifacts: Sequence[str], dp: int, tp: int) -> dict[str, Any]:
    """:func:`fsdp_adamw_step` for several artifacts on one (dp, tp) mesh."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    return {a: fsdp_adamw_step(a, mesh) for a in artifacts}


def fsdp_adamw_step(artifact: str, mesh: Any) -> dict[str, Any]:
    """One AdamW step with ``fully_shard`` over dp on a (dp, tp) mesh vs one process.

    Each dp rank takes its slice of the global batch; FSDP averages gradients over dp, so
    the step equals the single-process step on the whole batch (mean loss).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from hpcodegen.parity.gather import max_shard_diff
    from hpcodegen.parity.harness import token_batch
    from hpcodegen.runtime import MeshContext, parallelize_from_generated

    dp = mesh.size(0)
    ref, gen = build_pair(artifact)
    info = parallelize_from_generated(gen, MeshContext(mesh), EXAMPLES / artifact,
                                      hf_config=hf_config(artifact))
    for layer in gen.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(gen, mesh=mesh["dp"])
    ids, labels = token_batch(ref.config.vocab_size, dp * BATCH, SEQ)
    r = mesh.get_local_rank("dp")
    rows = slice(r * BATCH, (r + 1) * BATCH)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS)
    opt_gen = torch.optim.AdamW(gen.parameters(), lr=LR, eps=EPS)
    loss_ref = loss_of(ref(input_ids=ids, use_cache=False).logits, labels)
    loss_ref.backward()
    opt_ref.step()
    loss_gen = loss_of(gen(input_ids=ids[rows], use_cache=False).logits, labels[rows])
    loss_gen.backward()
    grad_diff = list(max_shard_diff(gen, {n: q.grad for n, q in ref.named_parameters()},
                                    info, lambda q: q.grad))
    opt_gen.step()
    mean_loss = loss_gen.detach().clone()
    dist.all_reduce(mean_loss, group=mesh.get_group("dp"))
    mean_loss /= dp
    moved = 0.0
    param_diff = list(max_shard_diff(gen, {n: q.detach() for n, q in ref.named_parameters()},
                                     info, lambda q: q.detach()))
    for p0, p1 in zip(build_pair(artifact)[0].parameters(), ref.parameters(), strict=True):
        moved = max(moved, (p0 - p1).abs().max().item())
    return {"loss": abs(mean_loss.item() - loss_ref.item()), "grad": grad_diff,
            "param": param_diff, "moved": moved}


def compare_dir(artifact_dir: str, config: str, tp: int) -> dict[str, float]:
    """Parity of an artifact directory (not an example: a meta edited by a test) against the
    unsharded model of example config ``config``, on a 1-D tp mesh."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.parity.harness import build_pair as harness_pair
    from hpcodegen.parity.harness import compare as harness_compare
    from hpcodegen.parity.harness import install

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    cfg = json.loads((EXAMPLES / "configs" / config / "config.json").read_text())
    pair = harness_pair(Path(artifact_dir), cfg, eval_mode=False, attn_implementation="sdpa")
    installed = install(pair, mesh)
    ids, labels = batch(pair.reference.config.vocab_size)
    result = harness_compare(pair.sharded, pair.reference, pair.plan, installed,
                             {"input_ids": ids}, labels)
    return {"logits": result.logits, "grad": result.grad, "grad_name": result.worst or "",
            "grad_scale": result.grad_scale}
