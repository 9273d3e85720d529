"""Rank worker for tests/runtime/test_family_parity*.py (spawned gloo ranks).

Each model: the library's parity harness (:mod:`hpcodegen.parity.harness`, the launcher's
own procedure): the unsharded transformers model and the artifact's generated classes with
the same weights, the plan installed on the second, one forward/backward of both, logits
and every gradient compared.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def parity_one(artifact: str, config_dir: str, mesh: Any,
               dtype: str = "float32", use_cache: bool = False) -> dict[str, Any]:
    import torch

    from hpcodegen.parity.harness import build_pair, compare, install, read_config, token_batch

    config_dict = read_config(config_dir)
    # parity.json beside a config: further inputs of its forward ({name: shape}, random;
    # Mllama's cross-attention layers run only when given vision states) and parameters
    # to draw at random (its tanh gates start at 0: no gradient would reach the layer)
    extra_file = Path(config_dir, "parity.json")
    spec = json.loads(extra_file.read_text()) if extra_file.is_file() else {}
    random_params = set(spec.get("random_params", ()))

    def draw(ref: Any) -> None:
        for name, p in ref.named_parameters():
            if name.rsplit(".", 1)[-1] in random_params:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))

    pair = build_pair(artifact, config_dict, dtype=getattr(torch, dtype), prepare=draw)
    installed = install(pair, mesh)
    config = pair.reference.config
    vocab = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
    # MusicGen's decoder reads batch x num_codebooks rows (its logits come back as many)
    rows = 2 * max(1, int(getattr(config, "num_codebooks", 1) or 1))
    g = torch.Generator().manual_seed(1)
    ids, labels = token_batch(vocab, rows, 16, generator=g)  # a text sub-config's vocab
    extra = {name: torch.randn(shape, generator=g).to(getattr(torch, dtype))
             for name, shape in spec.get("inputs", {}).items()}
    result = compare(pair.sharded, pair.reference, pair.plan, installed,
                     {"input_ids": ids, "use_cache": use_cache, **extra}, labels)
    return result.as_dict()


def parity_models(models: Sequence[tuple[str, str, str]], tp: int) -> dict[str, Any]:
    """``{name: diffs}`` for ``(name, artifact dir, config dir[, dtype])`` on one 1-D tp mesh
    (dtype ``float32`` unless given: ``float64`` separates float32 summation-order noise from
    a real mismatch where gradients are large)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    import torch.distributed as dist

    out: dict[str, Any] = {}
    for name, artifact, config, *dtype in models:
        try:  # a name ending in _cache runs with use_cache=True (a recurrent state's path)
            out[name] = parity_one(artifact, config, mesh, *(dtype or ["float32"]),
                                   use_cache=name.endswith("_cache"))
        except Exception as exc:  # reported per model; the other models still run
            import traceback

            out[name] = {"error": "".join(traceback.format_exception(exc))[-1500:]}
        dist.barrier()
    return out


def assert_parity(results: Sequence[dict[str, Any]], models: Sequence[Sequence[str]],
                  tol: float) -> None:
    """Every model ran on every rank with no error or unmatched parameter, logits and every
    gradient within ``tol``, and gradients large enough that ``tol`` tests something."""
    assert set(results[0]) == {m[0] for m in models}
    for rank, per_model in enumerate(results):
        for name, r in per_model.items():
            assert "error" not in r, (rank, name, r.get("error"))
            assert r["odd"] == [], (rank, name, r)
            assert r["logits"] <= tol, (rank, name, r)
            assert r["grad"] <= tol, (rank, name, r)
            assert r["grad_scale"] > 100 * tol, (rank, name, "gradients too small to test")
