"""inspect-plan's totals hold every collective the plan runs, and say what is estimated.

The existing system's Qwen3-MoE bundle (cp 2, tp 2, ep 2) runs its own factories for the
experts (an all_to_all dispatch over ep) and the attention (K/V gathered over cp): those
are counted, marked as estimates, in the prediction and in the headline bytes; its
``lm_head`` input, which the meta-device trace does not see, is estimated from the config
(not 0 B). The time is bandwidth plus a latency per collective (``--link-latency-us``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.inspect import InspectOptions, run_inspect

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "tests/fixtures/artifacts/qwen3_moe_bundle_g3"
CONFIG = ROOT / "tests/fixtures/configs/qwen3_moe_bundle"


def _json(**kw: Any) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = run_inspect(InspectOptions(path=str(BUNDLE), as_json=True, **kw), out,
                       io.StringIO())
    return code, json.loads(out.getvalue())


def test_the_bundles_ep_and_cp_collectives_are_predicted_without_torch() -> None:
    import subprocess
    import sys

    code, doc = _json()
    assert code == 0, doc["findings"]
    fwd = {(c["kind"], c["axis"]): c["count"] for c in doc["summary"]["collectives_per_forward"]}
    bwd = {(c["kind"], c["axis"]): c["count"] for c in doc["summary"]["collectives_per_backward"]}
    layers = 4
    assert fwd[("all_to_all", "ep")] == 3 * layers    # counts, dispatch, combine per layer
    assert bwd[("all_to_all", "ep")] == 2 * layers    # combine, dispatch
    assert fwd[("all_gather", "cp")] == 2 * layers    # key and value per attention
    assert bwd[("reduce_scatter", "cp")] == 2 * layers
    notes = [e["note"] for e in doc["summary"]["estimated"]]
    assert any("expert_parallel" in n and "all_to_all over ep" in n for n in notes), notes
    assert any("context_parallel" in n and "key/value all_gather" in n for n in notes), notes
    assert not doc["summary"]["opaque"]  # counted by estimate, not left opaque
    probe = ("import sys; from hpcodegen.inspect import InspectOptions, run_inspect; "
             f"run_inspect(InspectOptions(path={str(BUNDLE)!r}, as_json=True)); "
             "sys.stderr.write(str('torch' in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300)
    assert proc.stderr.strip().endswith("False"), proc.stderr[-500:]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_headline_holds_ep_cp_and_the_estimated_head() -> None:
    batch, seq = 2, 64
    code, doc = _json(hf_config=str(CONFIG), batch=batch, seq=seq, link_gbps=100.0,
                      link_latency_us=10.0)
    assert code == 0, [f for f in doc["findings"] if f["severity"] == "error"]
    v = doc["volume"]
    by = {(c["direction"], c["kind"], c["axis"]): c for c in v["by_collective"]}
    ep, cp = by[("forward", "all_to_all", "ep")], by[("forward", "all_gather", "cp")]
    assert ep["bytes"] > 0 and cp["bytes"] > 0
    # the headline is the sum of every collective, ep and cp included
    assert v["per_forward_bytes"] == pytest.approx(
        sum(c["bytes"] for c in v["by_collective"] if c["direction"] == "forward"))
    assert v["per_forward_bytes"] >= ep["bytes"] + cp["bytes"] + 1
    # cp K/V: [batch, kv_heads, seq, head_dim] bf16, one of 2 cp ranks' share, heads / tp 2
    text = json.loads((CONFIG / "config.json").read_text())
    kv = batch * text["num_key_value_heads"] * seq * text["head_dim"] * 2
    assert cp["bytes"] == pytest.approx(cp["count"] * kv / 2 / 2)
    # the untraced lm_head input is estimated (batch x seq x hidden), and says so
    head = next(r for r in v["boundaries"] if r["fqn"] == "lm_head")
    assert head["forward_bytes"] > 0
    assert all(o["estimated"] and "not traced" in o["estimated"] for o in head["ops"])
    assert head["ops"][0]["shape"] == [batch, seq, text["hidden_size"]]
    notes = " | ".join(e["note"] for e in v["estimated"])
    assert "not traced" in notes and "over ep 2" in notes and "context_parallel" in notes
    warned = [f["message"] for f in doc["findings"] if f["code"] == "trace.no_tensor"]
    assert warned and all("bytes are estimated" in m for m in warned)
    # time: bandwidth plus 10 us per collective, and the document says so
    n = v["forward_collectives"]
    assert n == sum(c["count"] for c in v["by_collective"] if c["direction"] == "forward")
    assert v["est_forward_s"] == pytest.approx(v["per_forward_bytes"] * 8 / 100e9 + n * 1e-5)
    assert v["link_latency_us"] == 10.0 and "latency" in v["time_model"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_text_says_what_the_time_includes() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = run_inspect(InspectOptions(path=str(BUNDLE), hf_config=str(CONFIG), batch=2,
                                      seq=64, link_gbps=100.0), out, err)
    text = " ".join(out.getvalue().split())
    assert code == 0, err.getvalue()[-2000:]
    assert "+ 5 us per collective" in text and "time model: bandwidth" in text
    assert "estimated in the totals" in text and "not traced" in text
