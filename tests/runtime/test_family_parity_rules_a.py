"""Parity on real gloo ranks for dense families split by package rules (set A).

transformers ships no ``base_model_tp_plan`` for these; ``hpcodegen/generate/rules/`` splits
their decoder layers. One spawn runs every model, each family's fixture plus the config
variants its rule treats apart: OPT post-LN without biases and with project_in/out, a
colwise fc1 whose output stays sharded into fc2; StableLM's q/k/v biases with the parallel
residual, and qk_layernorm (attention replicated); DiffLlama's head pairs (q/k/v packed in
two blocks) and, with too few kv heads for 2 * tp, its replicated attention; LFM2/LFM3
short-conv channels; GPT-NeoX Japanese's dense_bias added outside the region (a full
gradient); ModernBERT decoder with every bias on; BitNet's sub-norms on gathered
projections (also with --sp); CPM-Ant's head-sharded position bias and nested
feed-forward; MusicGen and MusicGen Melody (one LM head per codebook, the replicated
codebook embeddings of vocab_size + 1 rows, OPT-style fc1/fc2); Moshi (a recipe boundary
over MoshiLinear-wrapped projections, packed gate|up, a replicated odd embedding); xLSTM
(heads split by a divided copy of the config's num_heads; with use_cache the recurrent
state in and out of each layer; with biases; transformers 5.23 cannot initialise the
fused weight_mode's weights itself, so that variant is checked by generate only).
Logits and every gradient within 1e-5 of the unsharded model, and gradients large enough
for that to mean something. Each artifact is labelled by its family fixture (the label
changes no numbers), so a config and flags that tests/generate also plans, or that two
entries here share (xlstm and xlstm_cache), are built once per run (:mod:`artifact_memo`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from artifact_memo import build_bundle  # one build per distinct arguments and run
from family_workers import assert_parity, parity_models

from hpcodegen.hf import read_hf_config

pytestmark = [pytest.mark.gloo, pytest.mark.slow]

TOL = 1e-5
FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
#: (name, family fixture, config overrides)
MODELS = [
    ("opt", "opt", {}),
    ("opt_postln_nobias_proj", "opt", {"do_layer_norm_before": False, "enable_bias": False,
                                       "word_embed_proj_dim": 32, "tie_word_embeddings": False}),
    ("biogpt", "biogpt", {}),
    ("xglm", "xglm", {}),
    ("stablelm", "stablelm", {}),
    ("stablelm_bias_parallel", "stablelm", {"use_qkv_bias": True, "use_parallel_residual": True,
                                            "tie_word_embeddings": True}),
    ("stablelm_qk_layernorm", "stablelm", {"qk_layernorm": True}),
    ("persimmon", "persimmon", {}),
    ("diffllama", "diffllama", {"attention_bias": True}),
    ("diffllama_kv2", "diffllama", {"num_key_value_heads": 2}),
    ("lfm2", "lfm2", {"conv_bias": True}),
    ("lfm3", "lfm3", {}),
    ("gpt_neox_japanese", "gpt_neox_japanese", {}),
    ("modernbert_decoder", "modernbert-decoder", {"attention_bias": True, "mlp_bias": True,
                                                  "norm_bias": True}),
    ("bitnet", "bitnet", {"attention_bias": True}),
    ("bitnet_sp", "bitnet", {"attention_bias": True}),
    ("cpmant", "cpmant", {}),
    ("musicgen", "musicgen", {}),
    ("musicgen_melody", "musicgen_melody", {}),
    ("moshi", "moshi", {}),
    ("xlstm", "xlstm", {}),
    ("xlstm_cache", "xlstm", {}),
    ("xlstm_bias", "xlstm", {"use_bias": True}),
]


def _artifact(root: Path, name: str, family: str, overrides: dict) -> tuple[str, str, str]:
    from hpcodegen.artifact.bundle import write_bundle

    config, _ = read_hf_config(FAMILIES / family)
    config.update(overrides)
    config_dir = root / f"{name}_config"
    config_dir.mkdir()
    (config_dir / "config.json").write_text(json.dumps(config))
    sp = name.endswith("_sp")
    # labelled by the family, as tests/generate's plans are: the same config and flags are
    # then one build per run (xlstm_cache is xlstm's build; stablelm_qk_layernorm,
    # diffllama_kv2, lfm2, xlstm_bias are tests/generate/test_families_rules_a.py's)
    write_bundle(root / name, build_bundle(config, 2, sp, None, family))
    return name, str(root / name), str(config_dir)


@pytest.mark.timeout(400)
def test_package_rule_families_match_the_unsharded_model(tmp_path: Path, gloo) -> None:
    models = [_artifact(tmp_path, *m) for m in MODELS]
    results = gloo(2, parity_models, models, 2)
    assert_parity(results, models, TOL)
