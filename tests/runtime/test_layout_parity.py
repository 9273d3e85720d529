"""Megatron layouts against the unsharded model on 2 gloo ranks (logits, every gradient,
AdamW losses): DeepSeek-V3's MLA split without HF rules (with --sp too), Phi-3's fused
q|k|v and gate|up split per block, GLM-4's fused gate|up."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "moe"))

from hpcodegen.generate.api import GenerateArgs, generate_artifact
from hpcodegen.hf import read_hf_config

pytestmark = [pytest.mark.gloo, pytest.mark.slow]
FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
TOL = 1e-5


def _model(root: Path, name: str, config: dict) -> Path:
    model = root / "models" / name
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.timeout(300)
def test_layouts_match_unsharded(tmp_path: Path) -> None:
    from moe_configs import config_of
    from moe_workers import parity_cases
    from rt_workers import spawn

    phi3, _ = read_hf_config(FAMILIES / "phi3")
    glm4, _ = read_hf_config(FAMILIES / "glm4")
    models = {"deepseek_v3": config_of("deepseek_v3"),
              "phi3_mha": {**phi3, "num_key_value_heads": phi3["num_attention_heads"]},
              "glm4": glm4}
    cases = []
    for name, sp in (("deepseek_v3", True), ("phi3_mha", False), ("phi3_mha", True),
                     ("glm4", True)):
        model = tmp_path / "models" / name
        if not model.exists():
            _model(tmp_path, name, models[name])
        out = tmp_path / f"{name}_sp{int(sp)}"
        assert generate_artifact(GenerateArgs(model, 2, out, sp=sp)) == 0
        cases.append((f"{name} sp={sp}", str(out), str(model), 2))
    for rank in spawn(2, parity_cases, cases, out_dir=str(tmp_path)):
        for name, r in rank.items():
            assert not r["odd"], (name, r["odd"])
            assert r["logits"] <= TOL and r["grad"] <= TOL, (name, r)
            assert r["loss_diff"] <= TOL, (name, r)
