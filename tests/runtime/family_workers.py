"""Rank worker for tests/runtime/test_family_parity.py (spawned gloo ranks).

Each model: the unsharded transformers model and the model from the artifact's generated
classes with the same weights; the plan installed on the second; one forward/backward of
both; logits (gathered per the LM head's placement) and every gradient (gathered per the
parameter's placement) compared with :mod:`hpcodegen.launch.parity`, the launcher's own rule.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def parity_one(artifact: str, config_dir: str, mesh: Any,
               dtype: str = "float32", use_cache: bool = False) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from hpcodegen.artifact.load import load_meta
    from hpcodegen.hf import load_transformers_config, model_class_for
    from hpcodegen.launch.parity import full_logits, max_param_diff
    from hpcodegen.runtime import MeshContext, parallelize_from_generated
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module
    from hpcodegen.runtime.mesh import resolve_active_mesh

    config_dict = json.loads(Path(config_dir, "config.json").read_text())
    # parity.json beside a config: further inputs of its forward ({name: shape}, random;
    # Mllama's cross-attention layers run only when given vision states) and parameters
    # to draw at random (its tanh gates start at 0: no gradient would reach the layer)
    extra_file = Path(config_dir, "parity.json")
    spec = json.loads(extra_file.read_text()) if extra_file.is_file() else {}
    meta = load_meta(Path(artifact)).data
    config = load_transformers_config(config_dict)
    torch.manual_seed(0)
    ref = model_class_for(config_dict)(config).to(getattr(torch, dtype)).eval()
    gen = generated_model_class(meta, import_generated_module(Path(artifact)))(config)
    gen = gen.to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.rsplit(".", 1)[-1] in spec.get("random_params", ()):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    gen.load_state_dict(ref.state_dict())
    context = MeshContext(device_mesh=mesh)
    parallelize_from_generated(gen, context, artifact, hf_config=config_dict)
    active = resolve_active_mesh(meta, context)
    g = torch.Generator().manual_seed(1)
    vocab = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
    # MusicGen's decoder reads batch x num_codebooks rows (its logits come back as many)
    rows = 2 * max(1, int(getattr(config, "num_codebooks", 1) or 1))
    ids = torch.randint(0, vocab, (rows, 17), generator=g)  # a text sub-config's
    ids, labels = ids[:, :-1], ids[:, 1:]
    extra = {name: torch.randn(shape, generator=g).to(getattr(torch, dtype))
             for name, shape in spec.get("inputs", {}).items()}

    def loss_of(model: Any, sharded: bool) -> tuple[Any, Any]:
        logits = model(input_ids=ids, use_cache=use_cache, **extra).logits
        if sharded:
            logits = full_logits(logits, model, meta, active)
        return F.cross_entropy(logits.flatten(0, 1).to(getattr(torch, dtype)),
                               labels.flatten()), logits

    loss, logits = loss_of(gen, True)
    loss.backward()
    ref_loss, ref_logits = loss_of(ref, False)
    ref_loss.backward()
    grad, worst, odd = max_param_diff(gen, ref, meta, active, lambda p: p.grad)
    scale = max(float(p.grad.abs().max()) for p in ref.parameters() if p.grad is not None)
    return {"logits": float((logits.detach() - ref_logits.detach()).abs().max()),
            "grad": grad, "worst": worst, "odd": odd, "grad_scale": scale}


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
