"""inspect-plan on a pipelined artifact: per-stage lines, the bubble, the pp p2p
collectives in ``--json``, a Chrome trace with ``--timeline``; torch never imported
without ``--hf-config``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
sys.path.insert(0, str(Path(__file__).parent))
from test_check_pipeline import pp_meta


@pytest.fixture
def pp_dir(tmp_path):
    def make(schedule="ZBVZeroBubble", v=2, m=4):
        d = tmp_path / schedule
        d.mkdir()
        (d / "codegen_meta.json").write_text(json.dumps(pp_meta(schedule, 2, m, v)))
        return d
    return make


def _inspect(*args):
    code = ("import sys; from hpcodegen.inspect import InspectOptions, run_inspect;"
            f"c = run_inspect(InspectOptions(path={args[0]!r}, **{dict(args[1:])!r}));"
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(c)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_text_shows_each_stage_and_the_bubble(pp_dir):
    proc = _inspect(str(pp_dir()), ("checks", False))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "pipeline: ZBVZeroBubble pp=2 (2 stage(s)/rank, v), 4 microbatches" in out
    assert "stage 3 (rank 0): model.layers.3, model.norm, lm_head" in out
    assert "pp forward: 8 send/recv per step" in out


def test_json_lists_pp_p2p_and_the_bubble_and_the_timeline_is_a_trace(pp_dir, tmp_path):
    trace = tmp_path / "t.json"
    proc = _inspect(str(pp_dir("1F1B", 1, 8)), ("as_json", True),
                    ("timeline", str(trace)))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["bubble"] == pytest.approx(1 / 9, abs=1e-6)  # (p-1)/(m+p-1)
    assert [p["axis"] for p in doc["summary"]["p2p_per_step"]] == ["pp", "pp"]
    assert [s["in_flight"] for s in doc["pipeline"]["stages"]] == [2, 1]
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 2 * 2 * 8 and {e["tid"] for e in slices} == {0, 1}


def test_a_timeline_without_a_pipeline_is_a_usage_error(tmp_path):
    art = Path(__file__).resolve().parents[2] / "examples" / "llama_tp2"
    proc = _inspect(str(art), ("timeline", str(tmp_path / "t.json")))
    assert proc.returncode == 2
    assert "no pipeline section" in proc.stderr


def test_a_broken_action_list_read_without_checks_is_reported_not_a_traceback(tmp_path):
    meta = pp_meta("1F1B", 2, 4, 1)
    meta["pipeline"]["actions"]["1"][0] = "garbage"
    d = tmp_path / "bad"
    d.mkdir()
    (d / "codegen_meta.json").write_text(json.dumps(meta))
    proc = _inspect(str(d), ("as_json", True), ("checks", False))
    assert "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["pipeline"]["valid"] is False
    gated = _inspect(str(d), ("as_json", True))
    assert gated.returncode == 1
    assert any(f["code"] == "plan.pp_actions" for f in json.loads(gated.stdout)["findings"])


def test_dualpipev_in_flight_and_bubble_come_from_its_frozen_list(pp_dir, tmp_path):
    """DualPipeV at pp 2, m 6: stage s holds 2pp - s microbatches (a whole backward B
    releases its microbatch as a W does), the bubble is its simulated 1/37, and the
    timeline draws its whole and split backwards."""
    trace = tmp_path / "dpv.json"
    proc = _inspect(str(pp_dir("DualPipeV", 2, 6)), ("checks", False), ("as_json", True),
                    ("timeline", str(trace)))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["pipeline"]["schedule"] == "DualPipeV"
    assert [s["in_flight"] for s in doc["pipeline"]["stages"]] == [4, 3, 2, 1]
    assert doc["summary"]["bubble"] == pytest.approx(1 / 37, abs=1e-6)
    kinds = {e["cat"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"}
    assert kinds == {"F", "B", "I", "W"}
