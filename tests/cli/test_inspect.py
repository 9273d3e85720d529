"""``hpcodegen inspect-plan``: exit codes, the JSON shape, text tables, --mesh, no torch."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.inspect import InspectOptions, parse_mesh, run_inspect

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "inspect"
SP = str(FIXTURES / "llama_tp2_sp")


def inspect(**kw: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_inspect(InspectOptions(**kw), out, err)
    return code, out.getvalue(), err.getvalue()


def inspect_json(**kw: Any) -> tuple[int, dict[str, Any]]:
    code, out, _ = inspect(as_json=True, **kw)
    return code, json.loads(out)


PROBE = """
import json, sys
from hpcodegen.cli.app import main
sys.argv = ["hpcodegen", "inspect-plan", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
print("PROBE", json.dumps({"code": code, "heavy": sorted(
    m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def probe(*args: str) -> tuple[dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")][-1]
    return json.loads(line[len("PROBE "):]), proc.stdout + proc.stderr


@pytest.mark.timeout(400)
@pytest.mark.parametrize("args", [[SP], [SP, "--json", "--expand"], [SP, "--mesh", "tp=1"]])
def test_cli_runs_without_importing_torch(args: list[str]) -> None:
    result, output = probe(*args)
    assert result == {"code": 0, "heavy": []}, output
    assert "Traceback" not in output


@pytest.mark.timeout(400)
def test_cli_unreadable_input_exits_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "codegen_meta.json"
    bad.write_text("{not json")
    for target in (str(tmp_path / "missing"), str(bad)):
        proc = subprocess.run([sys.executable, "-m", "hpcodegen", "inspect-plan", target],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and target in proc.stderr


def test_unreadable_json_mode(tmp_path: Path) -> None:
    (tmp_path / "codegen_meta.json").write_text("[1, 2]")
    code, doc = inspect_json(path=str(tmp_path))
    assert code == 2 and doc["status"] == "error" and doc["exit_code"] == 2
    assert doc["verb"] == "inspect-plan"
    assert doc["findings"][0]["code"] == "load.not_object"


@pytest.mark.parametrize("mesh", ["tp", "tp=0", "tp=2,tp=4", "tp=x", "t p=2", ""])
def test_bad_mesh_is_a_usage_error(mesh: str) -> None:
    code, _, err = inspect(path=SP, mesh=mesh)
    assert code == 2 and "--mesh" in err


def test_an_unknown_mesh_axis_is_a_usage_error() -> None:
    """A typo'd axis (pt=4) must not pass silently as an all-identity prediction: exit 2,
    naming the plan's axes, in text and JSON alike."""
    for mesh in ("pt=4", "tp=2,cpp=2"):
        code, out, err = inspect(path=SP, mesh=mesh)
        assert code == 2 and "unknown axis" in err and "the plan's axes are tp" in err
        assert out == "" and "Traceback" not in err
    code, out, _ = inspect(path=SP, mesh="pt=4", as_json=True)
    doc = json.loads(out)
    assert code == 2 and doc["findings"][0]["code"] == "inspect.unknown_mesh_axis"
    code, _, err = inspect(path=SP, mesh="dp=2,tp=4")
    assert code == 0 and "none of the plan's axes" not in err


def test_a_mesh_of_known_axes_without_the_plans_warns() -> None:
    code, _, err = inspect(path=SP, mesh="dp=8")
    assert code == 0
    assert "--mesh dp=8 holds none of the plan's axes" in err and "expected one of tp" in err


def test_frozen_size1_mesh_says_nothing_is_installed(tmp_path: Path) -> None:
    """A tp=1 artifact (``generate --tp 1``): the runtime installs nothing on its own mesh,
    so nothing is counted (no tp collective runs at tp 1) and a warning says so."""
    meta = json.loads((FIXTURES / "llama_tp2_sp" / "codegen_meta.json").read_text())
    meta["parallel_dims"]["tp_size"] = 1
    (tmp_path / "codegen_meta.json").write_text(json.dumps(meta))
    code, doc = inspect_json(path=str(tmp_path), checks=False)
    assert code == 0
    warned = [f for f in doc["findings"] if f["code"] == "inspect.size1_mesh"]
    assert warned and "the runtime installs nothing" in warned[0]["message"]
    assert doc["summary"]["collectives_per_forward"] == []
    assert doc["summary"]["collectives_per_backward"] == []
    assert doc["summary"]["grad_sync_per_backward"] == []
    _, doc = inspect_json(path=SP)
    assert "inspect.size1_mesh" not in {f["code"] for f in doc["findings"]}


def test_frozen_tp1_ep_plan_counts_the_dispatch_only(tmp_path: Path) -> None:
    """tp 1 x ep 2: the runtime installs the expert dispatch (and nothing on tp); the
    warning says so and only the ep all_to_alls are counted."""
    meta = json.loads((FIXTURES / "llama_tp2_sp" / "codegen_meta.json").read_text())
    meta["parallel_dims"] |= {"tp_size": 1, "ep_size": 2, "sequence_parallel": False}
    entry = meta["param_plan"]["model.layers.0.mlp"]
    entry["params"] = {k: {**v, "ep": "S(0)"} for k, v in entry["params"].items()}
    meta["injections"] = [{"match": "model.layers.0.mlp", "ep_size": 2, "local_compute_fn":
                           {"_target_": "hpcodegen.runtime.moe.ep_dispatch"}}]
    (tmp_path / "codegen_meta.json").write_text(json.dumps(meta))
    code, doc = inspect_json(path=str(tmp_path), checks=False)
    assert code == 0
    warned = [f for f in doc["findings"] if f["code"] == "inspect.size1_mesh"]
    assert "installs only the expert dispatch of 1 MoE layer(s)" in warned[0]["message"]
    fwd = doc["summary"]["collectives_per_forward"]
    assert fwd == [{"kind": "all_to_all", "axis": "ep", "dim": None, "count": 3}]
    assert doc["summary"]["collectives_per_backward"] == [
        {"kind": "all_to_all", "axis": "ep", "dim": None, "count": 2}]
    # a live mesh with ep runs the dispatch although no dense axis is left; without, nothing
    _, doc = inspect_json(path=str(tmp_path), checks=False, mesh="tp=1,ep=2")
    assert doc["summary"]["collectives_per_forward"] == fwd and not doc["findings"]
    _, doc = inspect_json(path=str(tmp_path), checks=False, mesh="tp=1")
    assert doc["summary"]["collectives_per_forward"] == []


def test_parse_mesh() -> None:
    assert parse_mesh("tp=4,cp=2") == (("tp", "cp"), {"tp": 4, "cp": 2})


@pytest.mark.parametrize(("kw", "flag"), [
    ({"hf_config": "x"}, "--batch"), ({"hf_config": "x", "batch": 2}, "--seq"),
    ({"link_gbps": 10.0}, "--link-gbps"), ({"batch": 8}, "--batch needs --hf-config"),
    ({"seq": 8}, "--seq needs --hf-config"), ({"dtype": "fp7"}, "unknown dtype 'fp7'"),
    ({"hf_config": "x", "batch": 2, "seq": 4, "link_gbps": -1.0}, "--link-gbps"),
    ({"link_latency_us": 3.0}, "--link-latency-us needs --hf-config"),
    ({"hf_config": "x", "batch": 2, "seq": 4, "link_latency_us": 3.0},
     "--link-latency-us needs --link-gbps"),
    ({"hf_config": "x", "batch": 2, "seq": 4, "link_gbps": 1.0, "link_latency_us": -1.0},
     "--link-latency-us -1.0"),
])
def test_volume_usage_errors(kw: dict[str, Any], flag: str) -> None:
    code, _, err = inspect(path=SP, **kw)
    assert code == 2 and flag in err


def test_nonpositive_batch_is_named_not_called_missing() -> None:
    code, _, err = inspect(path=SP, hf_config="x", batch=-1, seq=4)
    assert code == 2 and "--batch -1: out of range (--batch must be >= 1)" in err
    assert "required" not in err


def _bad_plan(tmp_path: Path) -> Path:
    meta = json.loads((FIXTURES / "llama_tp2_sp" / "codegen_meta.json").read_text())
    meta["param_plan"]["lm_head"]["in_src"]["input"]["tp"] = "Shard(1)"
    (tmp_path / "codegen_meta.json").write_text(json.dumps(meta))
    return tmp_path


def test_bad_placement_exits_1_with_a_finding(tmp_path: Path) -> None:
    code, doc = inspect_json(path=str(_bad_plan(tmp_path)))
    assert code == 1 and doc["status"] == "fail"
    assert any("lm_head" in (f["path"] or "") for f in doc["findings"])


def test_bad_placement_without_checks_is_still_a_finding(tmp_path: Path) -> None:
    code, doc = inspect_json(path=str(_bad_plan(tmp_path)), checks=False)
    assert code == 1
    assert [f["code"] for f in doc["findings"]] == ["inspect.bad_entry"]
    assert "lm_head" not in {b["fqn"] for b in doc["boundaries"]}


def test_json_shape() -> None:
    code, doc = inspect_json(path=SP)
    assert code == 0 and doc["status"] == "ok"
    assert {"version", "status", "meta", "axes", "sizes", "boundaries", "summary",
            "findings"} <= set(doc)
    assert doc["axes"] == ["tp"] and doc["sizes"] == {"tp": 2}
    rows = {b["fqn"]: b for b in doc["boundaries"]}
    attn = rows["model.layers.{0..1}.self_attn"]
    assert attn["count"] == 2 and attn["fqns"] == ["model.layers.0.self_attn",
                                                   "model.layers.1.self_attn"]
    assert attn["class"] == "LlamaAttention" and attn["form"] == "tp_collective"
    assert attn["in_ops"] == [{"name": "hidden_states", "kind": "all_gather", "dim": 1,
                               "axis": "tp", "reduce_op": None}]
    assert attn["out_ops"][0]["kind"] == "reduce_scatter"
    assert attn["notes"] == ["hidden_states: tp S(1) -> R ==> all_gather(dim=1)",
                             "output: tp P(sum) -> S(1) ==> reduce_scatter(dim=1)"]
    assert "fqns" not in rows["lm_head"]
    summary = doc["summary"]
    assert summary["forms"] == {"identity": 5, "tp_collective": 6}
    assert {(c["kind"], c["axis"], c["dim"]): c["count"]
            for c in summary["collectives_per_forward"]} == {("all_gather", "tp", 1): 5,
                                                             ("reduce_scatter", "tp", 1): 5}
    assert summary["collectives_per_backward"] and summary["opaque"] == []
    assert "mesh" not in doc and "volume" not in doc


def test_expand_lists_every_boundary() -> None:
    _, doc = inspect_json(path=SP, expand=True)
    assert len(doc["boundaries"]) == 11 and all(b["count"] == 1 for b in doc["boundaries"])


def test_mesh_json_reports_changes() -> None:
    code, doc = inspect_json(path=SP, mesh="tp=1")
    assert code == 0 and doc["mesh"]["sizes"] == {"tp": 1}
    changes = doc["mesh"]["changes"]
    # as the runtime: no plan axis of size > 1 -> nothing installed, forwards as generated
    assert len(changes) == 6 and {c["effective_form"] for c in changes} == {"identity"}
    assert doc["summary"]["collectives_per_forward"] == []
    _, same = inspect_json(path=SP, mesh="dp=2,tp=4")
    assert same["mesh"]["changes"] == [] and same["axes"] == ["tp"]


def test_opaque_callables_listed() -> None:
    _, doc = inspect_json(path=str(FIXTURES / "moe_cp2_tp2"), checks=False)
    opaque = {(o["kind"], o["target"]): o["count"] for o in doc["summary"]["opaque"]}
    assert opaque == {("inner_wrapper", "hpcodegen.injections.sdpa_cp"): 3,
                      ("local_compute_fn", "hpcodegen.injections.ep_experts"): 3}


def test_text_tables() -> None:
    code, out, _ = inspect(path=SP)
    assert code == 0
    assert "model.layers.{0..1}.self_attn x2" in out
    assert "all_gather(tp, dim=1)" in out and "reduce_scatter(tp, dim=1)" in out
    assert "boundaries per form: identity 5, tp_collective 6" in out
    _, out, _ = inspect(path=SP, mesh="tp=1")
    assert "Form changes on the live mesh" in out and "exact no-op" in out


def test_grad_sync_follows_the_live_tp() -> None:
    _, doc = inspect_json(path=SP)
    assert doc["summary"]["grad_sync_per_backward"] == [
        {"kind": "all_reduce", "axis": "tp", "dim": None, "count": 1}]
    assert doc["summary"]["grad_sync_params"] == 5
    _, live = inspect_json(path=SP, mesh="tp=1")
    assert live["summary"]["grad_sync_per_backward"] == []


def test_mesh_checks_heads_and_widths_against_the_live_tp() -> None:
    """--mesh tp=3 on a 4-head model: an error naming the heads (generate's rule), from the
    meta's source.structure, or from --hf-config when given; tp=2 and tp=4 are fine."""
    root = Path(__file__).resolve().parents[2]
    art = str(root / "examples" / "llama_tp2")
    config = str(root / "examples" / "configs" / "llama")
    for kw in ({}, {"hf_config": config, "batch": 1, "seq": 8}):
        out = io.StringIO()
        code = run_inspect(InspectOptions(path=art, mesh="tp=3", as_json=True, **kw), out=out,
                           err=io.StringIO())
        doc = json.loads(out.getvalue())
        assert code == 1 and doc["status"] == "fail"
        found = {(f["code"], f["severity"]) for f in doc["findings"]
                 if f["code"].startswith("inspect.")}
        assert found == {("inspect.heads_not_divisible", "error"),
                         ("inspect.uneven_dim", "warning")}
        assert any("num_attention_heads = 4" in f["message"] for f in doc["findings"])
        assert doc["boundaries"]  # the prediction is still shown
    for mesh in ("tp=2", "tp=4"):
        assert run_inspect(InspectOptions(path=art, mesh=mesh, as_json=True),
                           out=io.StringIO(), err=io.StringIO()) == 0
