"""Parity on real gloo ranks for the state-space (recurrent) decoder families.

Their mixers are split over tp by channels with package rules
(hpcodegen/generate/rules/<model_type>.yaml): in_proj packed colwise, the depthwise conv,
dt_proj and the mixer's own per-channel A_log / D sharded on dim 0, out_proj rowwise, and a
rowwise x_proj nested in the mixer whose all_reduce also all-reduces its gradient (the
classifier's rule for outputs inside a partial region); Mamba-2's unequal packed in_proj
gathered, its out_proj split rowwise, the scan replicated; RWKV's time and channel mixing
split by channels; RecurrentGemma's RG-LRU blocks by heads (block-diagonal gates sharded
on their head dim), its attention by heads where the kv heads divide tp; the hybrid
Bamba / Falcon-H1 / Zamba2 with Mamba-2 mixers as Mamba-2, attention and MLP split; Zamba's
mixers by Mamba heads (zamba_h1: one head, the gathered fallback).
One spawn runs every model. Logits and every gradient within 1e-5 of the unsharded model.
RWKV runs in float64: its tiny embeddings (gain 1e-4) under a LayerNorm give gradients of
~100, whose float32 summation-order noise alone is ~1e-4.
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
TP2 = ["mamba", "falcon_mamba", "mamba2", "recurrent_gemma", "recurrent_gemma_gqa", "bamba",
       "falcon_h1", "zamba2", "zamba", "zamba_h1"]
FLOAT64 = ["rwkv"]


def _artifact(root: Path, family: str, dtype: str = "float32") -> tuple[str, ...]:
    from hpcodegen.artifact.bundle import write_bundle

    config, _ = read_hf_config(FAMILIES / family)
    name = f"{family}_tp2"
    write_bundle(root / name, build_bundle(config, 2, False, None, family))
    return name, str(root / name), str(FAMILIES / family), dtype


@pytest.mark.timeout(400)
def test_ssm_family_parity_tp2(tmp_path: Path, gloo) -> None:
    models = [_artifact(tmp_path, f) for f in TP2]
    models += [_artifact(tmp_path, f, "float64") for f in FLOAT64]
    results = gloo(2, parity_models, models, 2)
    assert_parity(results, models, TOL)
