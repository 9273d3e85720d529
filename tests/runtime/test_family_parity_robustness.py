"""Parity on real gloo ranks for the families generate used to crash on or refuse for
reasons other than missing rules.

Qwen 3.5, Llama 4 and Emu3 from their composite configs (the causal LM built from the text part;
hybrid linear/full attention, chunked attention with MoE), Granite-SWA (``local_params``
attention with per-head sinks split), MiniCPM3 (``mla_kv_a_proj``: replicated, partial
gradient), Gemma 3n (sparse MLP kept replicated by the package rules), BERT (tied output
biases), ProphetNet (a tied embedding alias made a vocab-parallel boundary), BigBird-Pegasus
(`tie_word_embeddings` set, yet its causal LM never ties the LM head to the embedding) and Cohere
Compass (RoPE by layer type: transformers' default config cannot build it, the tiny config gives
each layer type a RoPE).
One spawn runs every model; logits and every gradient within 1e-5 of the unsharded model.
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
TP2 = ["qwen3_5", "llama4", "emu3", "granite_swa", "minicpm3", "gemma3n_text", "bert",
       "prophetnet", "bigbird_pegasus", "cohere_compass_text"]
#: the families tests/generate/test_config_robustness.py plans from the same config at tp 2
#: (its ``meta_of``, label "t"): labelled alike, each is one build per run
#: (:mod:`artifact_memo`; the label changes no numbers); the others by their family
ROBUSTNESS_LABEL = {"qwen3_5", "llama4", "emu3", "granite_swa", "minicpm3", "gemma3n_text"}


def _artifact(root: Path, family: str) -> tuple[str, str, str]:
    from hpcodegen.artifact.bundle import write_bundle

    config, _ = read_hf_config(FAMILIES / family)
    name = f"{family}_tp2"
    label = "t" if family in ROBUSTNESS_LABEL else family
    write_bundle(root / name, build_bundle(config, 2, False, None, label))
    return name, str(root / name), str(FAMILIES / family)


@pytest.mark.timeout(400)
def test_family_parity_robustness(tmp_path: Path, gloo) -> None:
    models = [_artifact(tmp_path, f) for f in TP2]
    results = gloo(2, parity_models, models, 2)
    assert_parity(results, models, TOL)
