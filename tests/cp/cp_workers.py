"""Rank workers for the context-parallel tests (spawned gloo ranks).

Per case the library's parity harness (:mod:`hpcodegen.parity`): the unsharded model and
the artifact's with the same weights, the plan installed on a ``(cp, tp)`` mesh, then
:func:`~hpcodegen.parity.harness.compare` on the full batch, which cuts it per rank
(:func:`hpcodegen.runtime.cp.shard_batch`, the layout's positions), takes each rank's loss
over the global label count, sums the gradients over cp and compares the logits, put back
in order, at every valid position, and every gradient.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

#: batch shapes of the cases: "plain" (no mask, default positions), "padding" (left- and
#: right-padded rows: attention_mask zeros), "packed" (position ids restarting: 3 documents
#: in row 0, 2 in row 1), "odd" (a length the layout does not divide: padded by the helper)
CASES = ("plain", "padding", "packed", "odd")


def make_batch(case: str, vocab: int, seq: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(7)
    length = seq - 3 if case == "odd" else seq
    ids = torch.randint(0, vocab, (2, length), generator=g)
    out: dict[str, Any] = {"input_ids": ids}
    if case == "padding":
        mask = torch.ones(2, length, dtype=torch.long)
        mask[0, : length // 4] = 0          # left padding
        mask[1, length - length // 3:] = 0  # right padding
        out["attention_mask"] = mask
    if case == "packed":
        cuts = [[0, length // 3, length // 2, length], [0, 2 * length // 3, length]]
        pos = torch.zeros(2, length, dtype=torch.long)
        for row, bounds in enumerate(cuts):
            for a, b in itertools.pairwise(bounds):
                pos[row, a:b] = torch.arange(b - a)
        out["position_ids"] = pos
    return out


def shifted_labels(batch: dict[str, Any]) -> Any:
    """transformers' convention (the ids, -100 at padding) aligned per position."""
    import torch

    target = batch["input_ids"]
    if "attention_mask" in batch:
        target = target.masked_fill(batch["attention_mask"] == 0, -100)
    shifted = torch.full_like(target, -100)
    shifted[:, :-1] = target[:, 1:]
    return shifted


_MESHES: dict[tuple[int, int], Any] = {}


def mesh_of(cp: int, tp: int) -> Any:
    """One ``(cp, tp)`` mesh per shape per process (its groups are made once)."""
    from torch.distributed.device_mesh import init_device_mesh

    if (cp, tp) not in _MESHES:
        _MESHES[(cp, tp)] = init_device_mesh("cpu", (cp, tp), mesh_dim_names=("cp", "tp"))
    return _MESHES[(cp, tp)]


def cp_parity(artifact: str, config_dir: str, cp: int, tp: int, case: str,
              seq: int = 32) -> dict[str, Any]:
    """The parity harness's :func:`~hpcodegen.parity.harness.compare` on a ``(cp, tp)``
    mesh for one batch case."""
    import torch

    from hpcodegen.parity.harness import build_pair, compare, install, read_config

    torch.set_num_threads(1)
    mesh = mesh_of(cp, tp)
    pair = build_pair(artifact, read_config(config_dir))
    vocab = pair.reference.config.vocab_size
    full = make_batch(case, vocab, seq)
    # the helper passes position ids (the batch's, else 0..S-1): so does the reference (a
    # model deriving its own from the padding mask, OPT, would otherwise differ)
    full.setdefault("position_ids", torch.arange(full["input_ids"].shape[1]).expand(2, -1))
    r = compare(pair.sharded, pair.reference, pair.plan, install(pair, mesh),
                {**full, "use_cache": False}, shifted_labels(full), vocab)
    return {"logits": r.logits, "shape": list(r.sharded_logits.shape),
            "ref_shape": list(r.ref_logits.shape), "grad": r.grad, "worst": r.worst,
            "odd": r.odd, "grad_scale": r.grad_scale, "loss": r.loss, "ref_loss": r.ref_loss}


def cp_parity_cases(cases: list[tuple[str, str, str, int, int, str, int]]
                    ) -> dict[str, Any]:
    """``{name: cp_parity(...)}`` for ``(name, artifact, config, cp, tp, case, seq)``; one
    process start for all (errors are reported per case)."""
    import torch.distributed as dist

    out: dict[str, Any] = {}
    for name, *args in cases:
        try:
            out[name] = cp_parity(*args)
        except Exception as exc:
            import traceback

            out[name] = {"error": "".join(traceback.format_exception(exc))[-2500:]}
        dist.barrier()
    return out


def assert_cp_parity(results: list[dict[str, Any]], names: list[str], tol: float) -> None:
    for rank, per_case in enumerate(results):
        assert set(per_case) == set(names)
        for name, r in per_case.items():
            assert "error" not in r, (rank, name, r.get("error"))
            assert r["odd"] == [], (rank, name, r)
            assert r["shape"] == r["ref_shape"], (rank, name, r)
            assert r["logits"] <= tol, (rank, name, r)
            assert r["grad"] <= tol, (rank, name, r)
            assert abs(r["loss"] - r["ref_loss"]) <= tol, (rank, name, r)
            assert r["grad_scale"] > 100 * tol, (rank, name, "gradients too small to test")


def fsdp_cp_step(artifact: str, config_dir: str) -> dict[str, Any]:
    """Gradients and one SGD step with ``fully_shard`` over the flattened ``dp x cp`` mesh (FSDP2 on
    the source info's other axes, torchtitan's composition) against one process on the
    whole batch: each dp rank takes its rows, each cp rank its positions of them; the loss
    is each rank's tokens over the global label count, so gradients must be *summed* over
    ``dp x cp``: FSDP2 averages, so the loss it back-propagates is scaled by the ``dp x cp``
    size (``set_gradient_divide_factor(1.0)`` does the same where the backend has
    PREMUL_SUM; gloo has not)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hpcodegen.artifact.load import load_meta
    from hpcodegen.hf import load_transformers_config, model_class_for
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.runtime import MeshContext, parallelize_from_generated
    from hpcodegen.runtime.cp import shard_batch
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp"))
    config_dict = json.loads(Path(config_dir, "config.json").read_text())
    config = load_transformers_config(config_dict)
    plan = plan_from_meta(load_meta(Path(artifact)).data)
    torch.manual_seed(0)
    ref = model_class_for(config_dict)(config).float().eval()
    gen = generated_model_class(plan, import_generated_module(Path(artifact)))(config).eval()
    gen.load_state_dict(ref.state_dict())
    info = parallelize_from_generated(gen, MeshContext(device_mesh=mesh), artifact,
                                      hf_config=config_dict)
    dp_cp = mesh["dp", "cp"]._flatten("dp_cp")
    for layer in gen.model.layers:
        fully_shard(layer, mesh=dp_cp)
    fully_shard(gen, mesh=dp_cp)
    ids = torch.randint(0, config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(3))
    opts = [torch.optim.SGD(m.parameters(), lr=1.0) for m in (gen, ref)]  # scale-sensitive
    rows = ids[2 * mesh["dp"].get_local_rank():][:2]
    batch = shard_batch(gen, rows, labels=rows)
    loss = batch.loss(gen(**batch.inputs).logits, dp_group=mesh["dp"].get_group())
    (loss * dp_cp.size()).backward()
    logits = ref(input_ids=ids).logits
    ref_loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    ref_loss.backward()
    ref_params = dict(ref.named_parameters())
    grad = max(float((p.grad.full_tensor() - ref_params[n].grad).abs().max())
               for n, p in gen.named_parameters())
    for opt in opts:
        opt.step()
    worst = max(float((p.full_tensor() - ref_params[n]).abs().max())
                for n, p in gen.named_parameters())
    return {"param": worst, "grad": grad, "loss": float(batch.total(loss, mesh["dp"].get_group())),
            "ref_loss": float(ref_loss), "source_axes": [len(p) for p, _ in info.values()][:1]}


def cp_suite(cases: list[tuple], fsdp: tuple[str, str]) -> dict[str, Any]:
    """:func:`cp_parity_cases` then :func:`fsdp_cp_step` in one spawn (one process start)."""
    out = cp_parity_cases(cases)
    try:
        out["fsdp"] = fsdp_cp_step(*fsdp)
    except Exception as exc:
        import traceback

        out["fsdp"] = {"error": "".join(traceback.format_exception(exc))[-2500:]}
    return out
