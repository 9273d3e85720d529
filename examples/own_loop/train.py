"""Fine-tune a pretrained model with your own loop on your own dp x tp mesh.

Run it with plain torchrun (no hpcodegen launcher)::

    torchrun --nproc-per-node 4 examples/own_loop/train.py examples/llama_tp2 HF_DIR \\
        --steps 10 --checkpoint ckpt

``HF_DIR`` is what ``model.save_pretrained`` writes (``config.json`` and
``*.safetensors``). The mesh is yours: ``tp`` is the artifact's axis (its size must be
the artifact's), ``dp`` the rest of the world. ``Artifact.from_pretrained`` builds the
model from the config, installs the artifact's plan over ``mesh["tp"]`` and has each rank
read only its shards of the weights. Everything after that is an ordinary torch loop:
AdamW, gradient clipping, data parallelism over ``dp`` (FSDP2 with ``--fsdp``, else
averaging the gradients), and a ``torch.distributed.checkpoint`` save that ``--resume``
loads again, at any mesh.

Where the caller has already started ``torch.distributed`` (a program that runs this
file's ``main`` in its own ranks), the script trains on that process group and leaves it
running; otherwise it starts the gloo group from torchrun's variables and ends it.

``--report FILE`` writes what happened as JSON on rank 0 (losses, gradient norms, the
evaluation logits' path) for the test that runs this very file
(tests/launch/test_own_loop.py).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from hpcodegen import Artifact


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", help="the hpcodegen artifact directory")
    parser.add_argument("model_dir", help="config.json + *.safetensors (save_pretrained)")
    parser.add_argument("--tp", type=int, default=2, help="the artifact's tp size")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 over mesh['dp']")
    parser.add_argument("--checkpoint", help="save the trained weights here (DCP)")
    parser.add_argument("--resume", help="load weights saved by --checkpoint first")
    parser.add_argument("--report", help="rank 0 writes a JSON report here")
    return parser.parse_args()


def batch(vocab: int, rows: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded batch of token ids and next-token labels (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq_len + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def sharded_params(model: torch.nn.Module) -> bool:
    """Are the parameters DTensors (torch's clipping and norms then see the whole model)?"""
    return any(isinstance(p, DTensor) for p in model.parameters())


def clip_gradients(model: torch.nn.Module, max_norm: float) -> float:
    """Clip by the global norm; returns the norm before clipping (the unsharded model's)."""
    if sharded_params(model):
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    # a runtime whose parameters are plain local shards: its exact tensor-parallel clip
    from hpcodegen.checkpoint import clip_grad_norm_

    return float(clip_grad_norm_(model, max_norm))


def average_gradients(model: torch.nn.Module, dp_mesh) -> None:
    """Plain data parallelism without FSDP2: the mean of the dp replicas' gradients."""
    if dp_mesh.size() == 1:
        return
    group = dp_mesh.get_group()
    for p in model.parameters():
        if p.grad is not None:
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(grad, group=group)
            grad.div_(dp_mesh.size())


@torch.no_grad()
def eval_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    logits = model(input_ids=ids).logits
    model.train()
    return logits.full_tensor() if isinstance(logits, DTensor) else logits


def main() -> None:
    args = parse_args()
    owned = not dist.is_initialized()  # else the caller's group: used, left running
    if owned:
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()

    # 1. the pretrained model, sharded over mesh["tp"]; each rank reads only its shards
    model = Artifact.load(args.artifact).from_pretrained(args.model_dir, mesh=mesh)
    if args.resume:  # weights of an earlier run (saved at any mesh)
        state = get_model_state_dict(model)
        dcp.load(state, checkpoint_id=args.resume)
        set_model_state_dict(model, state)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=mesh["dp"])
    # the optimizer before any forward: FSDP2 leaves the root's parameters unsharded after
    # one, and an optimizer made then would hold those instead of the sharded ones
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    vocab = model.config.vocab_size
    eval_ids, _ = batch(vocab, 2, args.seq_len, seed=0)
    report = {"dtensor_params": sharded_params(model), "world": world,
              "param_types": {n: type(p).__name__ for n, p in model.named_parameters()},
              "mesh": {"dp": dp_size, "tp": args.tp}, "losses": [], "grad_norms": []}
    first_logits = eval_logits(model, eval_ids)

    # 2. the loop: each dp rank trains on its rows of a global batch of 2 * dp rows
    model.train()
    for step in range(args.steps):
        ids, labels = batch(vocab, 2 * dp_size, args.seq_len, seed=100 + step)
        rows = slice(2 * dp_rank, 2 * dp_rank + 2)
        logits = model(input_ids=ids[rows]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(),
                                                 labels[rows].reshape(-1))
        loss.backward()
        if not args.fsdp:
            average_gradients(model, mesh["dp"])
        norm = clip_gradients(model, args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, group=mesh["dp"].get_group())
        report["losses"].append(float(mean_loss) / dp_size)
        report["grad_norms"].append(norm)

    # 3. save (every rank writes its shards; DCP reshards on load)
    if args.checkpoint:
        dcp.save(get_model_state_dict(model), checkpoint_id=args.checkpoint)
    last_logits = eval_logits(model, eval_ids)
    if args.report and dist.get_rank() == 0:
        out = Path(args.report)
        torch.save({"first": first_logits, "last": last_logits}, out.with_suffix(".pt"))
        report["logits"] = str(out.with_suffix(".pt"))
        out.write_text(json.dumps(report, indent=2))
    dist.barrier()
    if owned:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
