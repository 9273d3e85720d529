"""inspect-plan --hf-config: shapes traced on the meta device, bytes per rank, time estimate.

Builds a tiny transformers Llama on the meta device (a few seconds).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.inspect import InspectOptions, run_inspect

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "inspect"
CONFIG = json.loads((FIXTURES / "llama_tiny" / "config.json").read_text())

pytestmark = pytest.mark.slow


def volume(meta: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = run_inspect(InspectOptions(path=str(FIXTURES / meta), as_json=True,
                                      hf_config=str(FIXTURES / "llama_tiny"), **kw),
                       out, io.StringIO())
    return code, json.loads(out.getvalue())


@pytest.mark.timeout(400)
def test_bytes_per_rank_for_sequence_parallel_llama() -> None:
    batch, seq = 2, 16
    code, doc = volume("llama_tp2_sp", batch=batch, seq=seq, dtype="bf16", link_gbps=100.0)
    assert code == 0, doc["findings"]
    v = doc["volume"]
    full = batch * seq * CONFIG["hidden_size"] * 2       # one hidden-states tensor in bf16
    per_op = full * (2 - 1) / 2                          # ring all_gather / reduce_scatter, n=2
    layers = CONFIG["num_hidden_layers"]
    n_ops = 2 * layers + 1  # attention + MLP per layer, + embed (RS) or lm_head (AG)
    assert v["per_forward_bytes"] == pytest.approx(2 * n_ops * per_op)
    assert v["per_backward_bytes"] == pytest.approx(2 * n_ops * per_op)
    # bandwidth plus the default latency per collective (docs/inspect-plan.md)
    assert v["link_latency_us"] == 5.0 and v["forward_collectives"] == 2 * n_ops
    assert v["est_forward_s"] == pytest.approx(v["per_forward_bytes"] * 8 / 100e9
                                               + 2 * n_ops * 5e-6)
    rows = {r["fqn"]: r for r in v["boundaries"]}
    attn = rows["model.layers.{0..1}.self_attn"]
    assert attn["count"] == layers
    assert [(o["direction"], o["name"], o["shape"], o["bytes"]) for o in attn["ops"]] == [
        ("forward", "hidden_states", [batch, seq, CONFIG["hidden_size"]], per_op),
        ("backward", "hidden_states", [batch, seq, CONFIG["hidden_size"]], per_op),
        ("forward", "output", [batch, seq, CONFIG["hidden_size"]], per_op),
        ("backward", "output", [batch, seq, CONFIG["hidden_size"]], per_op),
    ]
    assert attn["forward_bytes"] == pytest.approx(2 * per_op * layers)
    # the embedding's input is integer token ids: no backward op for it
    assert [o["direction"] for o in rows["model.embed_tokens"]["ops"]] == ["forward", "backward"]


@pytest.mark.timeout(400)
def test_live_mesh_sizes_and_dtype_change_the_bytes() -> None:
    batch, seq = 1, 8
    code, doc = volume("llama_tp2", batch=batch, seq=seq, dtype="fp32", mesh="tp=4")
    # 2 kv heads cannot split over tp=4: reported (exit 1), the bytes are still estimated
    assert code == 1
    assert [(f["code"], f["path"]) for f in doc["findings"] if f["severity"] == "error"] == [
        ("inspect.heads_not_divisible", "--mesh")]
    full = batch * seq * CONFIG["hidden_size"] * 4
    by = {(c["direction"], c["kind"]): c for c in doc["volume"]["by_collective"]}
    layers = CONFIG["num_hidden_layers"]
    fwd = by[("forward", "all_reduce")]
    assert fwd["count"] == 2 * layers + 1
    assert fwd["bytes"] == pytest.approx(fwd["count"] * full * 2 * 3 / 4)
    # attention and MLP inputs, and lm_head's (loss parallel: logits kept S(-1))
    assert by[("backward", "all_reduce")]["count"] == 2 * layers + 1
    assert doc["volume"]["est_forward_s"] is None
    lp = doc["volume"]["loss_parallel"]
    assert doc["loss_parallel_heads"] == lp["heads"] == ["lm_head"]
    assert ("forward", "all_gather") not in by  # no logits gather
    logits = batch * seq * CONFIG["vocab_size"] * 4
    assert lp["gather_bytes_saved"] == pytest.approx(logits * 3 / 4)


@pytest.mark.timeout(400)
def test_plan_for_another_model_names_the_missing_module() -> None:
    code, doc = volume("moe_cp2_tp2", batch=1, seq=4, checks=False)
    assert code == 1
    missing = [f for f in doc["findings"] if f["code"] == "trace.missing_module"]
    assert [f["path"] for f in missing] == ["model.layers.2.self_attn"]


@pytest.mark.timeout(400)
def test_config_problems_are_findings(tmp_path: Path) -> None:
    out = io.StringIO()
    missing = run_inspect(InspectOptions(path=str(FIXTURES / "llama_tp2_sp"), as_json=True,
                                         hf_config=str(tmp_path / "nope"), batch=1, seq=4),
                          out, io.StringIO())
    assert missing == 2 and json.loads(out.getvalue())["findings"][0]["code"] == \
        "config.not_found"
    bad = dict(CONFIG, num_attention_heads=3)  # 64 is not divisible by 3 heads
    (tmp_path / "config.json").write_text(json.dumps(bad))
    out = io.StringIO()
    code = run_inspect(InspectOptions(path=str(FIXTURES / "llama_tp2_sp"), as_json=True,
                                      hf_config=str(tmp_path), batch=1, seq=4),
                       out, io.StringIO())
    codes = [f["code"] for f in json.loads(out.getvalue())["findings"]]
    # the mesh-fit finding (3 heads on tp 2) is reported beside transformers' own refusal
    assert code == 1 and codes == ["inspect.heads_not_divisible",
                                   "config.model_unbuildable"], codes


def test_config_of_another_shape_is_refused_before_tracing(tmp_path: Path) -> None:
    """Bytes from another model's config would look right and be wrong: verify's signature
    check runs first (exit 1); --no-checks still traces on purpose."""
    examples = FIXTURES.parents[2] / "examples"
    config = json.loads((examples / "configs" / "llama" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, hidden_size=128)))
    opts = {"path": str(examples / "llama_tp2_sp"), "hf_config": str(tmp_path), "batch": 2,
            "seq": 16, "as_json": True}
    out = io.StringIO()
    assert run_inspect(InspectOptions(**opts), out, io.StringIO()) == 1
    codes = {f["code"] for f in json.loads(out.getvalue())["findings"]}
    assert "signature.structure" in codes
    assert run_inspect(InspectOptions(**opts, checks=False), io.StringIO(), io.StringIO()) == 0
