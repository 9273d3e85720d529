"""bench/plan_quality.py on two published shapes: the formula, the ratios, the last line.

Llama-3.2-1B's plan is Megatron's layout (ratios 1 within the routing-free rounding);
Phi-3-medium's fused q|k|v (40 query, 10 key/value heads) cannot be split per part, so its
plan stays above Megatron's with generate's note, listed as explained and left out of the
worst ratios.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
LINE = re.compile(r"^plan_quality: worst_comm_ratio=([\d.]+) worst_param_ratio=([\d.]+) "
                  r"families=(\d+)$")


#: decoder layers of the shapes the test measures: the published width (heads, hidden, the
#: fused q|k|v), the depth cut (``--configs``: the script's own way in for other shapes).
#: Generate derives and checks every layer, so the published 16 and 40 layers were most of
#: the test's CPU (17 CPU-s; 4 layers: 2). The layers are alike, so depth only moves the
#: weight of the embedding and logits terms: llama's plan is Megatron's at any depth, and
#: phi's gathered q|k|v keeps its comm ratio above 1.2 (1.24 and 1.43 here; 1.30 and 1.55 at
#: 40 layers, ``bench/README.md``)
LAYERS = 4


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_plan_quality_last_line_and_ratios(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    """The script's ``main`` in this process (torch and transformers already imported; the
    script keeps no state and sets nothing global), on the two published configs cut to
    :data:`LAYERS` layers, its printed report read back."""
    import plan_quality

    models = ("llama-3.2-1b", "phi-3-medium-4k")
    for name in models:
        config = json.loads((plan_quality.CONFIGS / name / "config.json").read_text())
        config["num_hidden_layers"] = LAYERS
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    assert plan_quality.main(["--models", ",".join(models), "--seq", "256",
                              "--configs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    match = LINE.match(lines[-1])
    assert match, lines[-1]
    comm, param, families = float(match[1]), float(match[2]), int(match[3])
    assert families == 2 and 1.0 <= comm <= 1.05 and 1.0 <= param <= 1.05
    phi = [line for line in lines if line.startswith("phi-3-medium-4k")]
    assert len(phi) == 2 and all("plan above Megatron's layout" in line for line in phi)
    assert all(float(line.split()[2]) > 1.2 for line in phi)  # the gathered q|k|v's cost


def test_megatron_formula_by_hand() -> None:
    """One dense layer, tp 4, no sp: 2 all_reduces forward (attention and MLP g) and 2
    backward (their f), the embedding all_reduce, the logits all_gather, the head's f."""
    from hpcodegen.plan.megatron import LayerShape, ModelShape, comm_bytes, param_bytes

    shape = ModelShape(hidden=8, vocab=32, layers=(LayerShape(),), tp_params=100,
                       whole_params=10)
    act = 2 * 16 * 8 * 2  # batch 2, seq 16, hidden 8, bf16
    ar, ag = 2 * 3 / 4 * act, 3 / 4 * act
    fwd, bwd = comm_bytes(shape, 4, False, 1, 2, 16, 2)
    assert fwd == 2 * ar + ar + 3 / 4 * 2 * 16 * 32 * 2
    assert bwd == 2 * ar + ar
    fwd_sp, bwd_sp = comm_bytes(shape, 4, True, 1, 2, 16, 2)
    assert fwd_sp == 4 * ag + ag + 3 / 4 * 2 * 16 * 32 * 2 + ag
    assert bwd_sp == 4 * ag + ag + ag
    assert param_bytes(shape, 4, 1, 2) == 2 * (100 / 4 + 10)


def test_splits_heads_reads_the_plan() -> None:
    """Heads must divide tp only when the plan splits them: a gathered fused q|k|v does not."""
    from hpcodegen.plan.codec import entries_from_json
    from hpcodegen.plan.tp_divisible import splits_heads, tp_divisibility

    region = entries_from_json({"self_attn": {"params": {"q_proj.weight": {"tp": "S(0)"}},
                                              "out_src": {"output": {"tp": "P(sum)"}}}})
    gathered = entries_from_json({"self_attn.qkv_proj": {
        "params": {"weight": {"tp": "S(0)"}}, "out_src": {"output": {"tp": "S(-1)"}},
        "out_dst": {"output": {"tp": "R"}}}})
    assert splits_heads(region) and not splits_heads(gathered)
    mixer = {"mixer": {"params": {"in_proj.weight": {"tp": "S(0)"}}}}
    assert splits_heads(entries_from_json(mixer))
    config = {"num_attention_heads": 40, "num_key_value_heads": 10}
    assert [f.code for f in tp_divisibility(config, 8, "generate", plan=region)] == [
        "generate.heads_not_divisible"]
    assert tp_divisibility(config, 8, "generate", plan=gathered) == []
