"""Reporters (text, json, junit) and the pre-commit conventions."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

from hpcodegen.checks.result import ArtifactResult, CheckResult, VerifyResult  # noqa: E402
from hpcodegen.errors import error, info, warning  # noqa: E402
from hpcodegen.report import REPORTERS  # noqa: E402
from hpcodegen.verify import run_verify  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def sample() -> VerifyResult:
    bad = error("plan.unknown_axis", "/param_plan/x/params/w/xp", "axis 'xp' [bold]unknown[/]",
                expected="tp", hint="fix it", file="m.json")
    art = ArtifactResult("art\x01dir", {
        "schema": CheckResult("schema", "pass"),
        "plan": CheckResult("plan", "fail", [bad, info("plan.unknown_key", "/k", "k")]),
        "outputs": CheckResult("outputs", "pass", [warning("outputs.unrecorded_file", "n.txt",
                                                           "n.txt unrecorded")]),
        "model": CheckResult("model", "skipped", reason="needs --hf-config"),
    })
    return VerifyResult([art])


def render(name: str, verbose: bool = False) -> str:
    out = io.StringIO()
    REPORTERS[name].write(sample(), out, verbose=verbose)
    return out.getvalue()


def test_reporters_are_registered_by_name() -> None:
    assert sorted(REPORTERS) == ["json", "junit", "text"]


def test_json_reporter_is_the_documented_shape() -> None:
    doc = json.loads(render("json"))
    assert doc["ok"] is False
    (art,) = doc["artifacts"]
    assert art["checks"]["model"] == {"status": "skipped", "reason": "needs --hf-config",
                                      "findings": []}
    assert art["checks"]["plan"]["findings"][0] == {
        "code": "plan.unknown_axis", "severity": "error", "path": "/param_plan/x/params/w/xp",
        "file": "m.json", "message": "axis 'xp' [bold]unknown[/]", "expected": "tp",
        "hint": "fix it"}


def test_text_reporter_rows_findings_and_no_markup_injection() -> None:
    text = render("text")
    assert re.search(r"plan\s+fail\s+1 error, 1 info", text)
    assert re.search(r"model\s+skipped\s+needs --hf-config", text)
    assert "m.json::/param_plan/x/params/w/xp: axis 'xp' [bold]unknown[/] (expected tp); " \
           "hint: fix it" in text
    assert "outputs.unrecorded_file" in text and "plan.unknown_key" not in text
    assert "plan.unknown_key" in render("text", verbose=True)
    assert "1 artifact: 0 passed, 1 failed" in text


def test_junit_reporter_is_valid_xml_even_with_control_characters() -> None:
    root = ET.fromstring(render("junit").split("\n", 1)[1])
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("4", "1", "1")
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "art\\x01dir"  # escaped, visible
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["plan"].find("failure").get("message").startswith("[error] plan.unknown_axis")
    assert cases["model"].find("skipped").get("message") == "needs --hf-config"
    assert cases["schema"].find("failure") is None


def test_pre_commit_hook_files_pattern_and_generated_files_stand_for_their_artifact(
        tmp_path: Path) -> None:
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert [h["id"] for h in hooks] == ["hpcodegen-verify", "hpcodegen-verify-system"]
    assert all(h["entry"] == "hpcodegen verify --changed-files" for h in hooks)
    art = vf.build_fixture("qwen3_moe_g3", tmp_path / "gen")
    changed = [art / "codegen_meta.json", art / vf.modeling_name(art),
               art / (vf.modeling_name(art) + ".diff"), tmp_path / "gen" / "__init__.py"]
    pattern = re.compile(hooks[0]["files"])
    assert all(pattern.search(str(p)) for p in changed)
    out = io.StringIO()
    assert run_verify(changed, output="json", stdout=out, changed_files=True,
                      allow_target=vf.REFERENCE_TARGETS) == 0
    assert [a["path"] for a in json.loads(out.getvalue())["artifacts"]] == [str(art)]


def test_json_usage_errors_still_print_one_json_document(tmp_path: Path) -> None:
    """--json: an unknown check or a --junit in a missing dir is exit 2 with JSON on stdout."""
    art = str(REPO / "examples" / "llama_tp2")
    for kwargs, needle in (({"only": ["bogus"]}, "unknown check(s): bogus"),
                           ({"junit": tmp_path / "nodir" / "v.xml"}, "--junit: directory"),
                           ({"junit": tmp_path}, "is a directory (expected a file name)")):
        out, err = io.StringIO(), io.StringIO()
        code = run_verify([art], output="json", stdout=out, stderr=err, **kwargs)
        assert code == 2
        doc = json.loads(out.getvalue())
        assert doc["ok"] is False and doc["artifacts"] == []
        assert (doc["verb"], doc["status"], doc["exit_code"]) == ("verify", "error", 2)
        assert needle in json.dumps(doc["findings"]) and needle in err.getvalue()


def test_junit_write_failure_is_a_usage_error(tmp_path: Path, monkeypatch) -> None:
    """An OSError writing --junit (read-only dir, full disk): exit 2 and why, no traceback."""
    import hpcodegen.verify as verify_mod

    def refuse(path, render):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(verify_mod, "write_atomic", refuse)
    out, err = io.StringIO(), io.StringIO()
    code = run_verify([str(REPO / "examples" / "llama_tp2")], junit=tmp_path / "v.xml",
                      stdout=out, stderr=err)
    assert code == 2
    assert "--junit: cannot write" in err.getvalue() and "No space left" in err.getvalue()


def test_a_single_path_string_is_one_artifact() -> None:
    """run_verify("dir") is one artifact, not one per character of the string."""
    out = io.StringIO()
    code = run_verify(str(REPO / "examples" / "llama_tp2"), output="json", stdout=out,
                      stderr=io.StringIO())
    assert code == 0 and len(json.loads(out.getvalue())["artifacts"]) == 1


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_junit_file_follows_the_umask(tmp_path: Path, mask: int) -> None:
    """--junit is written atomically through a temp file, yet with the umask's mode."""
    old = os.umask(mask)
    try:
        out = tmp_path / f"v{mask:o}.xml"
        run_verify([str(REPO / "examples" / "llama_tp2")], junit=out, stdout=io.StringIO())
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask
    assert ET.parse(out).getroot().get("tests") == "7"  # one testcase per check


def _text(result: VerifyResult, verbose: bool = False, quiet: bool = False) -> str:
    out = io.StringIO()
    REPORTERS["text"].write(result, out, verbose=verbose, quiet=quiet)
    return out.getvalue()


def test_a_passing_artifact_is_one_line_unless_verbose() -> None:
    arts = [ArtifactResult(f"art{i}", {
        "schema": CheckResult("schema", "pass", [info("plan.unknown_key", "/k", "k")]),
        "plan": CheckResult("plan", "pass"),
        "model": CheckResult("model", "skipped", reason="needs --hf-config")}) for i in range(8)]
    lines = _text(VerifyResult(arts)).splitlines()
    assert lines == [f"PASS art{i}: 2 passed, 1 skipped (model)" for i in range(8)] + [
        "8 artifacts: 8 passed, 0 failed"]
    verbose = _text(VerifyResult(arts), verbose=True)
    assert re.search(r"model\s+skipped\s+needs --hf-config", verbose)
    assert "plan.unknown_key" in verbose


def test_identical_findings_print_once_with_their_count_and_every_place() -> None:
    same = [warning("targets.foreign", f"/injections/{i}/_target_", "target x is foreign",
                    hint="trust it", file="m.json") for i in range(8)]
    other = warning("targets.foreign", "/injections/9/_target_", "target y is foreign",
                    hint="trust it", file="m.json")
    art = ArtifactResult("art", {"targets": CheckResult("targets", "pass", [*same, other])})
    text = _text(VerifyResult([art]))
    assert text.splitlines()[0] == "PASS art: 1 passed, 9 warnings"
    assert text.count("target x is foreign") == 1 and text.count("target y is foreign") == 1
    assert "(8 identical)" in text
    for i in range(8):
        assert f"/injections/{i}/_target_" in text
    failing = ArtifactResult("bad", {"plan": CheckResult("plan", "fail", [
        error("plan.x", f"/p/{i}", "same problem") for i in range(3)])})
    text = _text(VerifyResult([failing]))
    assert text.count("same problem") == 1 and "(3 identical)" in text
    assert "also at /p/1, /p/2" in text


def test_eight_passing_examples_print_nine_lines() -> None:
    examples = sorted(p.parent for p in (REPO / "examples").glob("*/codegen_meta.json"))
    assert len(examples) >= 8
    out = io.StringIO()
    assert run_verify(examples, stdout=out) == 0
    assert len(out.getvalue().splitlines()) == len(examples) + 1


def test_inspect_plan_folds_identical_findings_the_same_way() -> None:
    from hpcodegen.inspect.render import print_findings

    same = [warning("plan.foreign_system_target", f"/injections/{i}/_target_", "factory x",
                    file="m.json") for i in range(8)]
    err = io.StringIO()
    print_findings([*same, info("plan.note", "/k", "a note")], err)
    lines = err.getvalue().splitlines()
    assert lines[0] == "warning: (8 identical) m.json::/injections/0/_target_: factory x"
    assert "also at /injections/1/_target_," in lines[1]
    assert all(f"/injections/{i}/_target_" in err.getvalue() for i in range(8))
    assert "a note" not in err.getvalue()


@pytest.mark.parametrize("quiet", [False, True])
def test_a_passing_report_prints_what_rich_prints(monkeypatch, quiet: bool) -> None:
    """The plain lines a passing gate prints without importing rich are rich's lines:
    ``TTY_COMPATIBLE=0`` (no terminal, no style) sends the same result through rich."""
    arts = [ArtifactResult(f"examples/art {i}", {
        "schema": CheckResult("schema", "pass", [info("plan.unknown_key", "/k", "k")]),
        "plan": CheckResult("plan", "pass"),
        "model": CheckResult("model", "skipped", reason="needs --hf-config")}) for i in range(3)]
    plain = _text(VerifyResult(arts), quiet=quiet)
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert _text(VerifyResult(arts), quiet=quiet) == plain
    assert plain == ("" if quiet else "".join(
        f"PASS examples/art {i}: 2 passed, 1 skipped (model)\n" for i in range(3))
        + "3 artifacts: 3 passed, 0 failed\n")


@pytest.mark.parametrize("columns", ["40", "80", "0"])
def test_a_folded_passing_report_folds_as_rich_does(monkeypatch, columns: str) -> None:
    """Lines longer than ``COLUMNS`` fold at spaces the same with or without rich."""
    monkeypatch.setenv("COLUMNS", columns)
    arts = [ArtifactResult("a/" + "d" * n, {"plan": CheckResult("plan", "pass"),
                                            "model": CheckResult("model", "skipped")})
            for n in (10, 33, 50, 70, 90)]
    plain = _text(VerifyResult(arts))
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert _text(VerifyResult(arts)) == plain
    if columns == "40":
        assert f"  a/{'d' * 50}:" in plain.splitlines()  # folded, the path whole


def test_a_warned_report_goes_through_rich() -> None:
    warned = ArtifactResult("art", {"outputs": CheckResult("outputs", "pass", [
        warning("outputs.unrecorded_file", "n.txt", "n.txt unrecorded")])})
    assert "outputs.unrecorded_file" in _text(VerifyResult([warned]))
