"""Partial gradients summed over tp in one flattened all_reduce per backward.

A 16-layer Llama under --sp has 33 replicated parameters with partial gradients (two norms
per layer and the final norm): the backward runs one all_reduce for all of them, the same
as a 2-layer model (fake process group, CommDebugMode, equal to inspect-plan's count), and
the gradients, accumulated over two backwards, equal the unsharded model's (gloo ranks).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hpcodegen.generate.api import GenerateArgs, generate_artifact

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-5


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One root for the module's artifact: :func:`_llama` generates the 16-layer one once
    (counted by one test and accumulated on gloo ranks by the other)."""
    return tmp_path_factory.mktemp("grad_buckets")


def _llama(root: Path, layers: int) -> tuple[Path, Path]:
    """(artifact, model dir) of the example Llama at ``layers`` deep, tp 2 with --sp: the
    2-layer one is the committed example (``examples/llama_tp2_sp``, which
    tests/generate/test_byte_identity.py keeps equal to generate's output), so only the
    16-layer one is generated."""
    if layers == 2:
        return ROOT / "examples/llama_tp2_sp", ROOT / "examples/configs/llama"
    model = root / f"llama{layers}"
    out = root / f"llama{layers}_tp2_sp"
    if out.exists():
        return out, model
    config = json.loads((ROOT / "examples/configs/llama/config.json").read_text())
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    assert generate_artifact(GenerateArgs(model, 2, out, sp=True)) == 0
    return out, model


def _backward_all_reduces(out: Path, model_dir: Path) -> tuple[int, int, int]:
    """(all_reduces the backward ran, inspect-plan's, partial parameters synced)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.hf import load_transformers_config
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.plan.predict import predict_plan, summarize
    from hpcodegen.runtime import parallelize_from_generated
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module

    meta = json.loads((out / "codegen_meta.json").read_text())
    config = json.loads((model_dir / "config.json").read_text())
    model = generated_model_class(plan_from_meta(meta), import_generated_module(out))(
        load_transformers_config(config)).float()
    parallelize_from_generated(model, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)),
                               out, hf_config=config)
    logits = model(input_ids=torch.randint(0, config["vocab_size"], (2, 8))).logits
    with CommDebugMode() as mode:
        logits.float().pow(2).mean().backward()
    ran = Counter()
    for op, n in mode.get_comm_counts().items():
        ran[str(op).split(".")[-1]] += n
    summary = summarize(predict_plan(plan_from_meta(meta)))
    predicted = sum(n for (k, _, _), n in {**summary.per_backward, **summary.grad_sync}.items()
                    if k == "all_reduce")
    return ran["allreduce_"], predicted, summary.grad_sync_params


@pytest.mark.timeout(400)
@pytest.mark.filterwarnings("ignore:.*backward hook:UserWarning")
def test_sixteen_layers_sync_in_one_collective(shared: Path, fake_world) -> None:
    small = _llama(shared, 2)
    deep = _llama(shared, 16)
    fake_world(2)
    ran2, predicted2, params2 = _backward_all_reduces(*small)
    ran16, predicted16, params16 = _backward_all_reduces(*deep)
    assert (params2, params16) == (5, 33)
    assert ran2 == ran16 == predicted2 == predicted16 == 1


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sixteen_layers_accumulate_exactly(shared: Path, gloo) -> None:
    from grad_workers import accumulate_case

    out, model = _llama(shared, 16)
    results = gloo(2, accumulate_case, str(out), str(model))
    for r in results:
        assert not r["odd"], r
        assert r["logits"] <= TOL and r["grad"] <= TOL, r
        assert r["counts"][0] == r["counts"][1]  # a constant number per backward
