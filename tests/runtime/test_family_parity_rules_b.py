"""Parity on real gloo ranks for the GPT-style families split by package rules (batch b).

transformers ships no base_model_tp_plan for these; ``hpcodegen/generate/rules/*.yaml``
split their decoder layers: BLOOM (ALiBi, residual added inside the sublayers: gathered
qkv and split-input closers), GPTBigCode multi-query (one shared k/v head: gathered) and
multi-head (per-head interleaved c_attn), GPT-SW3 (GPT-2's classes: GPT-2's rules),
OpenAI GPT (Conv1D, packed q|k|v), GPT-J (rotary, parallel sublayers), CodeGen (mp_num
blocked qkv: gathered), MPT (ALiBi sliced per rank from the replicated bias), CTRL
(three attention inputs v, k, q; nn.Sequential MLP), GPT-Neo (global and local layers), and
XLNet / GIT / TrOCR (residual inside the sublayer modules: gathered colwise, split-input
rowwise), and three families split by rules they share with others or by parts: BLT
(four Llama-style stacks split by heads, cross-attention with a second input gathered /
split-input), Fuyu (its Persimmon language model under model.language_model,
split by the fused projections' traced row order), Mllama (self-attention layers split
by heads, a cross-attention layer, given vision states, gathered / split-input).
With --sp: GPTBigCode multi-query, CodeGen (gathered qkv under a sequence-gathering
parent), GPT-Neo. One spawn runs every model; logits and every gradient within 1e-5 of
the unsharded model.
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
TP2 = ["bloom", "gpt_bigcode", "gpt_bigcode_mha", "gpt-sw3", "openai-gpt", "gptj", "codegen",
       "mpt", "ctrl", "gpt_neo", "xlnet", "git", "trocr", "blt", "fuyu", "mllama"]
SP = ["gpt_bigcode", "codegen", "gpt_neo"]


def _artifact(root: Path, family: str, sp: bool = False) -> tuple[str, str, str]:
    from hpcodegen.artifact.bundle import write_bundle

    config, _ = read_hf_config(FAMILIES / family)
    name = f"{family}_tp2" + ("_sp" if sp else "")
    write_bundle(root / name, build_bundle(config, 2, sp, None, family))
    return name, str(root / name), str(FAMILIES / family)


@pytest.mark.timeout(400)
def test_family_parity_package_rules_b(tmp_path: Path, gloo) -> None:
    models = [_artifact(tmp_path, f) for f in TP2]
    models += [_artifact(tmp_path, f, sp=True) for f in SP]
    results = gloo(2, parity_models, models, 2)
    assert_parity(results, models, TOL)
