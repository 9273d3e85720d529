"""Phase 2 of the coverage measure: parity of each family's artifact on gloo ranks.

The library's parity harness (:mod:`hpcodegen.parity.harness`) on the tp 2 (and ``--sp``)
artifact of every family that verified: logits and every gradient against the unsharded
model, within :data:`TOL`. On a float32 miss, two float64 runs tell float32 rounding from
a sharding error (:func:`parity_one`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TOL = 1e-5


def parity_one(artifact: str, config_dir: str, mesh: Any) -> dict[str, Any]:
    """One forward/backward of the parallelized model vs the unsharded one, same weights.

    On a float32 miss two float64 runs tell rounding from a sharding error: the unsharded
    model in float64 (how far float32 itself is from the exact answer: ``f64``), and the
    same parity check with both models in float64 (``exact64``: where the sharded model
    is exact, this is near 1e-15 however large the float32 miss).
    """
    import torch

    from hpcodegen.hf import load_transformers_config
    from hpcodegen.parity.harness import read_config, token_batch
    from hpcodegen.parity.lengths import smoke_length_for

    config_dict = read_config(config_dir)
    config = load_transformers_config(config_dict)
    # the rows the model takes: MusicGen's decoder reads batch x num_codebooks rows
    rows = 2 * max(1, int(getattr(config, "num_codebooks", 1) or 1))
    vocab = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
    # 16 tokens, bounded by the config's max positions (the one length rule)
    length = smoke_length_for(config, 16, exercise_window=False).length
    batch = token_batch(vocab, rows, length)  # a text sub-config's vocabulary
    result = _parity_at(artifact, config_dict, batch, mesh, torch.float32, exact=True)
    if not result["ok"] and not result["odd"] and "f64" in result:
        try:  # a float32-only kernel cannot run this diagnostic; the float32 miss stands
            again = _parity_at(artifact, config_dict, batch, mesh, torch.float64)
        except Exception:
            return result
        result["exact64"] = {"logits": again["logits"], "grad": again["grad"],
                             "ok": again["ok"]}
    return result


def _parity_at(artifact: str, config_dict: Mapping[str, Any], batch: tuple[Any, Any],
               mesh: Any, dtype: Any, exact: bool = False) -> dict[str, Any]:
    """The parity harness at ``dtype``; with ``exact``, a miss also gets the float64
    distances of the sharded and unsharded results."""
    from hpcodegen.parity.harness import build_pair, compare, install

    pair = build_pair(artifact, config_dict, dtype=dtype)
    installed = install(pair, mesh)
    ids, labels = batch
    inputs = {"input_ids": ids, "use_cache": False}
    r = compare(pair.sharded, pair.reference, pair.plan, installed, inputs, labels)
    result = {"logits": r.logits, "grad": r.grad, "worst": r.worst, "odd": r.odd,
              "ok": r.logits <= TOL and r.grad <= TOL and not r.odd}
    if exact and not result["ok"] and not r.odd:  # how far is float32 from the exact answer?
        try:
            result["f64"] = _float64_distances(pair, installed, r, inputs, labels)
        except Exception:  # a float32-only kernel: the float32 numbers stand alone
            result.pop("f64", None)
    return result


def _float64_distances(pair: Any, installed: Any, r: Any, inputs: Mapping[str, Any],
                       labels: Any) -> dict[str, float]:
    """The sharded and the unsharded float32 results against the unsharded model in
    float64 (the same weights): logits and gradients."""

    from hpcodegen.hf import model_class_for
    from hpcodegen.parity.gather import max_param_diff
    from hpcodegen.parity.harness import loss_and_logits

    ref = pair.reference
    exact_ref = model_class_for(pair.config_dict)(ref.config).double().eval()
    exact_ref.load_state_dict(ref.state_dict())
    exact_loss, exact_logits = loss_and_logits(exact_ref, inputs, labels, pair.plan, None)
    exact_loss.backward()
    exact_logits = exact_logits.detach()
    return {
        "sharded_logits": float((r.sharded_logits.double() - exact_logits).abs().max()),
        "unsharded_logits": float((r.ref_logits.double() - exact_logits).abs().max()),
        "sharded_grad": max_param_diff(pair.sharded, exact_ref, pair.plan, installed.active,
                                       lambda p: p.grad)[0],
        "unsharded_grad": max(float((a.grad.double() - b.grad).abs().max())
                              for a, b in zip(ref.parameters(), exact_ref.parameters(),
                                              strict=True) if a.grad is not None)}


def parity_jobs(jobs: list[tuple[str, str, str]], out_dir: str) -> dict[str, Any]:
    """Rank work: every ``(key, artifact, config dir)`` on one tp mesh over the world (a
    ``.../cp2`` key on a cp mesh: :func:`hpcodegen.families.cp.cp_parity_one`); the
    results so far written after each job (a spawn that dies keeps them)."""
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.parity.ranks import result_path

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    cp_mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    results: dict[str, Any] = {}
    for key, artifact, config_dir in jobs:
        try:
            if key.endswith("/cp2"):
                from hpcodegen.families.cp import cp_parity_one

                results[key] = cp_parity_one(artifact, config_dir, cp_mesh)
            else:
                results[key] = parity_one(artifact, config_dir, mesh)
        except Exception as exc:
            results[key] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        dist.barrier()
        result_path(out_dir, dist.get_rank()).write_text(json.dumps(results))
    return results


def parity_worker(jobs_file: Path, out_dir: Path, world: int = 2) -> None:
    """The jobs of ``jobs_file`` on ``world`` spawned gloo ranks (results in ``out_dir``)."""
    from hpcodegen.parity.ranks import spawn

    spawn(world, parity_jobs, json.loads(jobs_file.read_text()), str(out_dir),
          out_dir=out_dir)
