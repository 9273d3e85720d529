"""Parity on real gloo ranks for the dense families of each former class of failure.

One spawn runs every model (the process start is paid once): Gemma's scaled word
embedding (a class of the generated file, vocab-parallel, tied to the LM head), Phi-3 /
OLMo 2 / GLM-4 (gathered colwise + rowwise_split_input), GPT-2 / Falcon / Hunyuan-V1 dense
(package rules; GPT-2's Conv1D with a packed q|k|v and rowwise biases), Apertus (xIELU
scalars no rule names: replicated, partial gradient synchronised), with --sp for several
(Phi-3's attention then gathers the sequence itself; Gemma 2's eager attention takes a mask
built for the full sequence; Nemotron's LayerNorm1P bias gradient is partial; OLMo 2's
RMSNorm class runs on R in its gathered attention and on S(1) between layers).
Logits and every gradient within 1e-5 of the unsharded model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from artifact_memo import build_bundle  # one build per distinct arguments and run
from family_workers import assert_parity, parity_models

from hpcodegen.hf import read_hf_config

pytestmark = [pytest.mark.gloo, pytest.mark.slow]

TOL = 1e-5
FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
TP2 = ["gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "glm4", "gpt2", "falcon",
       "falcon_gqa", "hunyuan_v1_dense", "apertus", "starcoder2", "gpt_neox"]
SP = ["gemma", "phi3", "apertus", "gemma2", "nemotron", "olmo2"]


def _artifact(root: Path, family: str, sp: bool) -> tuple[str, str, str]:
    from hpcodegen.artifact.bundle import write_bundle

    config, _ = read_hf_config(FAMILIES / family)
    name = f"{family}_tp2" + ("_sp" if sp else "")
    write_bundle(root / name, build_bundle(config, 2, sp, None, family))
    return name, str(root / name), str(FAMILIES / family)


@pytest.mark.timeout(420)
def test_family_parity_tp2_and_sp(tmp_path: Path, gloo) -> None:
    models = [_artifact(tmp_path, f, False) for f in TP2]
    models += [_artifact(tmp_path, f, True) for f in SP]
    results = gloo(2, parity_models, models, 2)
    assert_parity(results, models, TOL)
