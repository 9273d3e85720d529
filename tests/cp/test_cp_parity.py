"""Context parallelism exact on real gloo ranks: logits (put back in order) and every
gradient within 1e-5 of the unsharded model, losses equal.

One spawn of 4 ranks runs every case (the process start is paid once) on two meshes:
``cp 2 x tp 2`` (with and without ``--sp``, one loss-parallel) and ``cp 4``. The families:
Llama with GQA (8 query heads, 2 kv heads: each tp rank gathers one kv head), Mistral with
a sliding window of 3 (shorter than every rank's chunk at sequence 32: cp 4
head-tail chunks are 4 long), Gemma 2 with attention softcapping on its eager kernel and
alternating sliding/full layers; both layouts; padding (left and right), packed documents
(position ids restarting), and a length the layout does not divide (the helper pads).
"""

from __future__ import annotations

import pytest
from cp_paths import CONFIGS
from cp_workers import assert_cp_parity, cp_suite

pytestmark = [pytest.mark.gloo, pytest.mark.slow]

TOL = 1e-5
SEQ = 32
#: (config, tp, cp, sp, layout, loss parallel, cases)
PLAN = [
    ("llama_gqa", 2, 2, False, None, False, ("padding", "packed")),
    ("llama_gqa", 2, 2, True, None, True, ("plain",)),
    ("mistral_swa", 2, 2, True, None, False, ("plain", "padding", "odd")),
    ("gemma2_softcap", 2, 2, True, "contiguous", False, ("packed", "padding")),
    ("mistral_swa", 1, 4, False, None, False, ("plain", "packed")),
    ("gemma2_softcap", 1, 4, False, "contiguous", False, ("padding",)),
]


def _cases(cp_artifact) -> list[tuple]:
    out = []
    for config, tp, cp, sp, layout, lp, cases in PLAN:
        art = cp_artifact(config, tp=tp, cp=cp, sp=sp, layout=layout, loss_parallel=lp)
        mesh_tp = 4 // cp  # every case runs on the 4 ranks of the spawn
        for case in cases:
            name = f"{art.name}:{case}"
            out.append((name, str(art), str(CONFIGS / config), cp, mesh_tp, case, SEQ))
    return out


@pytest.mark.timeout(480)
def test_cp_is_exact_on_every_family_layout_and_batch_kind(cp_artifact, gloo) -> None:
    """Also, in the same spawn, FSDP2 over the flattened ``dp 2 x cp 2`` mesh (the source
    info names no cp axis): gradients and an SGD step equal the unsharded model's on the
    whole batch (each dp rank its rows, each cp rank its positions of them)."""
    cases = _cases(cp_artifact)
    fsdp = (str(cp_artifact("llama_gqa", tp=1, cp=2)), str(CONFIGS / "llama_gqa"))
    results = gloo(4, cp_suite, cases, fsdp)
    for r in [result.pop("fsdp") for result in results]:
        assert "error" not in r, r.get("error")
        assert r["source_axes"] == [0], r  # cp is FSDP's: the source info names no cp axis
        assert abs(r["loss"] - r["ref_loss"]) <= TOL, r
        assert r["grad"] <= TOL and r["param"] <= TOL, r
    assert_cp_parity(results, [c[0] for c in cases], TOL)


def test_the_sliding_window_matters_at_this_length() -> None:
    """The window (3) changes the unsharded logits at sequence 32: a CP mask that dropped
    it would fail the parity above."""
    import torch

    from hpcodegen.hf import load_transformers_config, model_class_for, read_hf_config

    for name in ("mistral_swa", "gemma2_softcap", "qwen2_swa"):
        data, _ = read_hf_config(CONFIGS / name)
        torch.manual_seed(0)
        windowed = model_class_for(data)(load_transformers_config(data)).eval()
        full = model_class_for(data)(load_transformers_config({**data,
                                                               "sliding_window": 4 * SEQ}))
        full.load_state_dict(windowed.state_dict())
        ids = torch.randint(0, 256, (1, SEQ))
        with torch.no_grad():
            a = windowed(input_ids=ids).logits
            b = full.eval()(input_ids=ids).logits
        assert (a - b).abs().max() > 1e-3, name

