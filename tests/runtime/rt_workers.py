"""Rank workers for the runtime tests (spawned processes; real gloo ranks or the fake PG).

Each worker builds the unsharded transformers model and the model from the artifact's
generated classes with the same weights, installs the plan on the second one and compares
logits and every gradient (the reference gradient chunked by the parameter's placement).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
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
    import torch

    from hpcodegen.hf import load_transformers_config, model_class_for
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module

    config_dict = hf_config(artifact)
    config = load_transformers_config(config_dict)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    ref = model_class_for(config_dict)(config).float()
    from hpcodegen.artifact.load import load_meta

    meta = load_meta(EXAMPLES / artifact).data
    gen_cls = generated_model_class(meta, import_generated_module(EXAMPLES / artifact))
    gen = gen_cls(config).float()
    gen.load_state_dict(ref.state_dict())
    return ref, gen


def batch(vocab: int, seed: int = 1) -> tuple[Any, Any]:
    """Token ids and next-token labels (seeded, the same on every rank)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def loss_of(logits: Any, labels: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def local_of(full: Any, placements: Sequence[Any], mesh: Any) -> Any:
    """The shard of ``full`` this rank holds under ``placements`` on ``mesh``."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    if all(isinstance(p, Replicate) for p in placements):
        return full
    return distribute_tensor(full.detach().clone(), mesh, placements).to_local()


def compare(artifact: str, mesh: Any) -> dict[str, float]:
    """Install the artifact on a fresh model, run forward+backward, return max diffs.

    ``artifact`` may end in ``:plain``: the model is then built from the transformers
    classes instead of the generated ones.
    """
    from hpcodegen.runtime import parallelize_from_generated

    artifact, _, variant = artifact.partition(":")
    ref, gen = build_pair(artifact)
    if variant in ("plain", "dtensor"):  # unmodified transformers classes, wrapped instances
        gen = type(ref)(ref.config).float()
        gen.load_state_dict(ref.state_dict())
    if variant == "dtensor":  # every transition through DTensor.redistribute, none lowered
        import hpcodegen.runtime.generic as generic

        lowered, generic.transition_fn = generic.transition_fn, generic.dtensor_fn
    try:
        info = parallelize_from_generated(gen, mesh, EXAMPLES / artifact,
                                          hf_config=hf_config(artifact))
    finally:
        if variant == "dtensor":
            generic.transition_fn = lowered
    ids, labels = batch(ref.config.vocab_size)
    out_ref = ref(input_ids=ids).logits  # default use_cache: a DynamicCache is built
    out_gen = gen(input_ids=ids).logits
    loss_of(out_ref, labels).backward()
    loss_of(out_gen, labels).backward()
    result = {"logits": (out_ref - out_gen).abs().max().item(),
              "grad_scale": max(p.grad.abs().max().item() for p in ref.parameters())}
    ref_params = dict(ref.named_parameters())
    worst, worst_name = 0.0, ""
    for name, p in gen.named_parameters():
        placements, source = info[name]
        assert isinstance(placements, tuple), (name, placements)  # FSDP2 needs a tuple
        want = local_of(ref_params[name].grad, placements, source)
        diff = (p.grad - want).abs().max().item()
        if diff > worst:
            worst, worst_name = diff, name
    result["grad"] = worst
    result["grad_name"] = worst_name
    return result


def run_ranks(rank: int, world: int, init_method: str, out_dir: str, fn: Callable[..., Any],
              args: tuple) -> None:
    """Spawn target: init gloo, run ``fn(*args)``, write its JSON result per rank."""
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            init_method=init_method)
    try:
        result = fn(*args)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        # every rank done before any tears its sockets down: a rank closing while a peer
        # still reads the tail of the last collective aborts that peer (seen under load)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(world: int, fn: Callable[..., Any], *args: Any, out_dir: str) -> list[Any]:
    """Run ``fn`` on ``world`` gloo ranks; return the per-rank results."""
    import torch.multiprocessing as mp

    # A file rendezvous in the test's own dir: no free-port race with other jobs.
    init_method = Path(out_dir, "rendezvous").resolve().as_uri()
    mp.spawn(run_ranks, args=(world, init_method, out_dir, fn, args), nprocs=world, join=True)
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]


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

    from hpcodegen.runtime import MeshContext, parallelize_from_generated

    dp = mesh.size(0)
    ref, gen = build_pair(artifact)
    info = parallelize_from_generated(gen, MeshContext(mesh), EXAMPLES / artifact,
                                      hf_config=hf_config(artifact))
    for layer in gen.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(gen, mesh=mesh["dp"])
    ids, labels = batch_global(ref.config.vocab_size, dp * BATCH)
    r = mesh.get_local_rank("dp")
    rows = slice(r * BATCH, (r + 1) * BATCH)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=LR, eps=EPS)
    opt_gen = torch.optim.AdamW(gen.parameters(), lr=LR, eps=EPS)
    loss_ref = loss_of(ref(input_ids=ids, use_cache=False).logits, labels)
    loss_ref.backward()
    opt_ref.step()
    loss_gen = loss_of(gen(input_ids=ids[rows], use_cache=False).logits, labels[rows])
    loss_gen.backward()
    grad_diff = _max_diff(gen, {n: q.grad for n, q in ref.named_parameters()}, info,
                          lambda q: q.grad)
    opt_gen.step()
    mean_loss = loss_gen.detach().clone()
    dist.all_reduce(mean_loss, group=mesh.get_group("dp"))
    mean_loss /= dp
    moved = 0.0
    param_diff = _max_diff(gen, {n: q.detach() for n, q in ref.named_parameters()}, info,
                           lambda q: q.detach())
    for p0, p1 in zip(build_pair(artifact)[0].parameters(), ref.parameters(), strict=True):
        moved = max(moved, (p0 - p1).abs().max().item())
    return {"loss": abs(mean_loss.item() - loss_ref.item()), "grad": grad_diff,
            "param": param_diff, "moved": moved}


def _max_diff(gen: Any, want: dict[str, Any], info: dict[str, Any],
              get: Callable[[Any], Any]) -> list[Any]:
    """Max abs diff of each FSDP parameter's tp-local value vs the reference's shard."""
    worst: list[Any] = [0.0, ""]
    for name, p in gen.named_parameters():
        value = get(p)
        local = value.full_tensor() if hasattr(value, "full_tensor") else value
        placements, source = info[name]
        diff = (local - local_of(want[name], placements, source)).abs().max().item()
        if diff > worst[0]:
            worst = [diff, name]
    return worst


def batch_global(vocab: int, rows: int, seed: int = 1) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, SEQ + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
