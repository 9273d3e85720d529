"""``hpcodegen verify`` end to end: fixtures and shipped examples pass, output shapes, options,
exit codes, no torch on the pure path, speed, and artifact code is never executed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import inproc
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

from hpcodegen.hf import read_hf_config, source_from_config  # noqa: E402
from hpcodegen.verify import run_verify  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ALL_CHECKS = ["schema", "plan", "targets", "outputs", "source", "signature", "model"]
ENV = {**os.environ, "NO_COLOR": "1"}


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m hpcodegen ARGS...``: a real process, where what stays out of it (an
    artifact's code run) is the point."""
    return subprocess.run([sys.executable, "-m", "hpcodegen", *args], capture_output=True,
                          text=True, cwd=REPO, env=ENV, timeout=timeout)


def cli_here(*args: str) -> subprocess.CompletedProcess[str]:
    """``cli``'s command through the same entry point in this process (:mod:`inproc`):
    output and exit code as a pipe reads them, without an interpreter start per case."""
    return inproc.run(*args, cwd=REPO)


def verify_json(paths: list[Path], **kw: Any) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = run_verify(paths, output="json", stdout=out, stderr=io.StringIO(), **kw)
    return code, json.loads(out.getvalue())


@pytest.mark.parametrize("name", sorted(vf.FIXTURES))
def test_fixtures_of_both_generations_pass_every_check(name: str, tmp_path: Path) -> None:
    art = vf.build_fixture(name, tmp_path / name)
    config = FIXTURES / "configs" / vf.CONFIG_OF[name]
    code, doc = verify_json([art], hf_config=config, strict=True,
                            allow_target=vf.REFERENCE_TARGETS)
    checks = doc["artifacts"][0]["checks"]
    assert code == 0, json.dumps(checks, indent=1)
    assert list(checks) == ALL_CHECKS
    assert {c["status"] for c in checks.values()} == {"pass"}


def test_committed_fixtures_equal_the_builders(tmp_path: Path) -> None:
    vf.main(tmp_path)
    for path in sorted((tmp_path).rglob("*")):
        if path.is_file():
            rel = path.relative_to(tmp_path)
            assert (FIXTURES / rel).read_bytes() == path.read_bytes(), rel


def _config_for(meta_path: Path) -> Path:
    """The example config whose architecture, type and structure the meta records."""
    meta = json.loads(meta_path.read_text())
    src = meta["source"]
    want = {k: src.get(k) for k in ("architecture", "model_type")}
    want["structure"] = src.get("structure", {})
    for cfg in sorted((REPO / "examples" / "configs").glob("*/config.json")):
        if source_from_config(read_hf_config(cfg)[0]) == want:
            return cfg.parent
    raise AssertionError(f"no examples/configs/* matches {meta_path}")


EXAMPLES = sorted((REPO / "examples").glob("*/codegen_meta.json"))


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/*/codegen_meta.json should be shipped"


@pytest.mark.parametrize("meta", EXAMPLES, ids=lambda p: p.parent.name)
def test_shipped_examples_pass_with_hf_config(meta: Path) -> None:
    code, doc = verify_json([meta.parent], hf_config=_config_for(meta))
    checks = doc["artifacts"][0]["checks"]
    assert code == 0, json.dumps(checks, indent=1)
    assert {n: c["status"] for n, c in checks.items()} == {n: "pass" for n in ALL_CHECKS}


def test_json_shape_and_skips_without_hf_config(tmp_path: Path) -> None:
    art = vf.build_fixture("qwen3_moe_g3", tmp_path / "a")
    other = vf.build_fixture("qwen3_moe_g2", tmp_path / "b") / "codegen_meta.json"
    code, doc = verify_json([art, other, art / "codegen_meta.json"],
                            allow_target=vf.REFERENCE_TARGETS)
    assert code == 0 and doc["ok"] is True
    assert [a["path"] for a in doc["artifacts"]] == [str(art), str(other)]  # each once
    checks = doc["artifacts"][0]["checks"]
    assert set(doc) == {"version", "tool", "tool_version", "verb", "status", "exit_code",
                        "findings", "ok", "artifacts"}
    assert (doc["verb"], doc["status"], doc["exit_code"]) == ("verify", "ok", 0)
    assert set(doc["artifacts"][0]) == {"path", "ok", "checks"}
    for name in ("signature", "model"):
        assert checks[name]["status"] == "skipped"
        assert "--hf-config" in checks[name]["reason"]
    finding = checks["plan"]["findings"][0]
    assert set(finding) == {"code", "severity", "path", "file", "message", "expected", "hint"}


def test_only_and_skip_choose_checks(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    _, doc = verify_json([art], only=["schema,plan"])
    assert list(doc["artifacts"][0]["checks"]) == ["schema", "plan"]
    _, doc = verify_json([art], skip=["source", "model"], only=[])
    assert list(doc["artifacts"][0]["checks"]) == ["schema", "plan", "targets", "outputs",
                                                   "signature"]


def test_skipping_plan_keeps_the_targets_check(tmp_path: Path) -> None:
    """``--skip plan`` turns off the plan's rules, not the injection-target gate: a foreign
    ``_target_`` still fails; only ``--skip targets`` names that gate."""
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    meta = vf.read_meta(art)
    meta["injections"] = [{"match": "lm_head", "inner_wrapper": {"_target_": "os.system"}}]
    vf.save_meta(art, meta)
    code, doc = verify_json([art], skip=["plan"])
    checks = doc["artifacts"][0]["checks"]
    assert code == 1 and "plan" not in checks
    assert [(f["code"], f["path"]) for f in checks["targets"]["findings"]] == [
        ("plan.foreign_target", "/injections/0/inner_wrapper/_target_")]
    code, doc = verify_json([art], skip=["plan", "targets"])
    assert "targets" not in doc["artifacts"][0]["checks"]


def test_strict_fails_on_warnings(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    (art / "stray.txt").write_text("x\n")
    assert verify_json([art])[0] == 0
    code, doc = verify_json([art], strict=True)
    assert code == 1 and doc["artifacts"][0]["checks"]["outputs"]["status"] == "fail"


def test_junit_is_written_atomically(tmp_path: Path) -> None:
    good = vf.build_fixture("llama_hp", tmp_path / "good")
    bad = vf.build_fixture("llama_hp", tmp_path / "bad")
    (bad / vf.modeling_name(bad)).write_text("changed\n")
    report = tmp_path / "out" / "verify.xml"
    report.parent.mkdir()
    code = run_verify([good, bad], junit=report, stdout=io.StringIO())
    assert code == 1
    assert sorted(p.name for p in report.parent.iterdir()) == ["verify.xml"]
    root = ET.parse(report).getroot()
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [str(good), str(bad)]
    assert root.get("failures") == "2"  # outputs (drift) and source (the file is no module)
    bad_cases = {c.get("name"): c for c in suites[1].findall("testcase")}
    assert "sha256" in bad_cases["outputs"].find("failure").text
    assert bad_cases["model"].find("skipped") is not None


def test_text_report_names_check_status_and_location(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    meta = vf.read_meta(art)
    meta["param_plan"]["lm_head"]["params"]["weight"]["xp"] = "R"
    vf.save_meta(art, meta)
    proc = cli_here("verify", str(art))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "FAIL " + str(art) in proc.stdout
    assert "plan.unknown_axis" in proc.stdout
    assert "/param_plan/lm_head/params/weight/xp" in proc.stdout
    assert "needs --hf-config" in proc.stdout
    assert "\x1b[" not in proc.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["verify"], "no artifact to verify: name at least one artifact directory"),
    (["verify", "--json"], '"code": "verify.no_artifact"'),
    (["verify", "{art}", "--only", "bogus"], "unknown check(s): bogus"),
    (["verify", "{art}", "--junit", "{tmp}/no/dir/x.xml"], "does not exist"),
    (["verify", "{art}", "--hf-config", "{tmp}/nowhere", "--json"], "config.not_found"),
], ids=["no_path", "no_path_json", "unknown_check", "junit_dir_missing", "hf_config_missing"])
def test_usage_and_unreadable_inputs_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    proc = cli_here(*(a.format(art=art, tmp=tmp_path) for a in args))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle in proc.stdout + proc.stderr


_PROBE = textwrap.dedent("""
    import io, sys, time
    t0 = time.perf_counter()
    from hpcodegen.verify import run_verify
    code = run_verify([sys.argv[1]], hf_config=sys.argv[2], skip=["model"], stdout=io.StringIO())
    elapsed = time.perf_counter() - t0
    from hpcodegen.cli.app import app, register_verbs
    register_verbs()
    try:
        app(["schema"], standalone_mode=False)
    except SystemExit:
        pass
    print(code, elapsed, "torch" in sys.modules, "transformers" in sys.modules, file=sys.stderr)
""")


def test_pure_verify_and_schema_never_import_torch(tmp_path: Path) -> None:
    """Speed is bench/gate_speed.py's job (side by side with ``import torch``); here only
    what cannot be noisy: neither verify without ``model`` nor ``schema`` imports torch."""
    art = vf.write_artifact(tmp_path / "big", vf.llama_meta(layers=7), vf.llama_source())
    assert len(vf.read_meta(art)["param_plan"]) >= 30
    config = vf.write_config(tmp_path / "cfg", dict(vf.LLAMA_CONFIG, num_hidden_layers=7))
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(art), str(config)],
                          capture_output=True, text=True, env=ENV, timeout=300)
    code, _elapsed, torch, transformers = proc.stderr.split()[-4:]
    assert (code, torch, transformers) == ("0", "False", "False"), proc.stderr
    assert json.loads(proc.stdout)["$schema"].endswith("2020-12/schema")


_SIDE_EFFECT = "open({marker!r}, 'w').write('executed')\n"


def test_verify_never_executes_artifact_code(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    marker = tmp_path / "executed.txt"
    name = vf.modeling_name(art)
    evil = _SIDE_EFFECT.format(marker=str(marker))
    vf.rewrite_file(art, name, evil + (art / name).read_text())
    vf.rewrite_file(art, "__init__.py", evil)
    vf.rewrite_file(art, "configuration_llama.py", evil)
    meta = vf.read_meta(art)
    meta["remote_siblings"] = ["configuration_llama.py"]
    vf.save_meta(art, meta)
    config = FIXTURES / "configs" / "llama"
    code, doc = verify_json([art], hf_config=config)
    assert code == 0, json.dumps(doc, indent=1)
    proc = cli("verify", str(art), "--hf-config", str(config), "--skip", "model")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists()
