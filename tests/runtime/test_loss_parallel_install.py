"""``parallelize_from_generated`` refuses at install what verify's model check refuses about
loss parallelism (the one rule, :mod:`hpcodegen.plan.loss_parallel`), before anything is
sharded, imported or communicated; it checks a meta-device copy, never the live model.
Fake process group, one process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rt_artifacts import copy_artifact

from hpcodegen.errors import PlanError
from hpcodegen.runtime.loader import package_name

sys.path.append(str(Path(__file__).resolve().parents[1] / "fixtures"))
import loss_parallel_fixtures as lpf

pytestmark = pytest.mark.timeout(400)
FLAG = "/parallel_dims/loss_parallel"


@pytest.fixture
def tp2(fake_world):
    from torch.distributed.device_mesh import init_device_mesh

    fake_world(2)
    return init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))


def _build(config: dict):
    import torch

    from hpcodegen.hf import load_transformers_config, model_class_for

    torch.manual_seed(0)
    return model_class_for(config)(load_transformers_config(config)).float()


def test_postprocessing_model_refused_before_anything_runs(tmp_path, tp2) -> None:
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.runtime import parallelize_from_generated

    art, config_dir = lpf.hand_edited_inkling(tmp_path / "inkling")
    model = _build(lpf.config_dict(config_dir))
    before = {n: (p, p.shape) for n, p in model.named_parameters()}
    attn = model.config._attn_implementation
    with CommDebugMode() as comms, pytest.raises(PlanError) as info:
        parallelize_from_generated(model, tp2, art)
    (finding,) = info.value.findings
    assert (finding.code, finding.where) == ("runtime.loss_parallel_postprocess", FLAG)
    assert "an index on the vocabulary dim" in finding.message
    assert "output of lm_head" in finding.message and "modeling_inkling.py:" in finding.message
    assert comms.get_total_counts() == 0
    assert {n: (p, p.shape) for n, p in model.named_parameters()} == before
    assert model.config._attn_implementation == attn  # the check ran on a copy
    assert not any("forward" in vars(m) for m in model.modules())
    assert not getattr(model, "_hp_parallelized", False)
    assert not any(m.startswith(package_name(art)) for m in sys.modules)


def test_loss_parallel_llama_installs_and_keeps_logits_sharded(tmp_path, tp2) -> None:
    import torch

    from hpcodegen.runtime import parallelize_from_generated

    config = lpf.config_dict(lpf.HERE.parents[1] / "examples" / "configs" / "llama")
    art = lpf.write_generated(tmp_path / "llama_lp", config, loss_parallel=True)
    model = _build(config)
    parallelize_from_generated(model, tp2, art)
    logits = model(input_ids=torch.zeros(1, 4, dtype=torch.long)).logits
    assert logits.shape == (1, 4, config["vocab_size"] // 2)


def test_head_left_vocab_sharded_without_the_flag_refused(tmp_path, tp2) -> None:
    from hpcodegen.runtime import parallelize_from_generated

    art = copy_artifact("llama_tp2", tmp_path / "undeclared", lpf.keep_logits_sharded)
    model = _build(lpf.config_dict(lpf.HERE.parents[1] / "examples" / "configs" / "llama"))
    with pytest.raises(PlanError) as info:
        parallelize_from_generated(model, tp2, art)
    assert [(f.code, f.where) for f in info.value.findings] == [
        ("runtime.loss_parallel_undeclared", FLAG)]
