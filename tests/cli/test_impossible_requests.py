"""Impossible sizes, unwritable targets and the last recipe cases (issue 34).

Every numeric option of every verb is bounded by one rule (:mod:`hpcodegen.bounds`): a size
or length outside what can exist is a usage error, exit 2, before anything is read or
started. ``launch --save`` and ``export -o`` under a path that cannot be created are
refused first. Recipes bound their integers and take YAML merge keys. ``generate -o`` over
an old artifact removes only the files generate wrote.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import inproc
import pytest
from hpcodegen.cli.app import app, register_verbs
from typer.testing import CliRunner

pytestmark = pytest.mark.timeout(400)
register_verbs()
REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "configs" / "llama"
EXAMPLE = REPO / "examples" / "llama_tp2"
HUGE = str(10**30)
DIGITS_5000 = "7" * 5000


def _run(*args: str | Path) -> tuple[int, dict]:
    res = CliRunner().invoke(app, [*map(str, args), "--json"], catch_exceptions=False)
    return res.exit_code, json.loads(res.stdout)


def _codes(doc: dict) -> list[str]:
    return [f["code"] for f in doc["findings"]]


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The entry point with stdout and stderr kept apart, in this process (:mod:`inproc`)."""
    return inproc.run(*args, cwd=REPO)


INSPECT = ["inspect-plan", EXAMPLE, "--hf-config", LLAMA]


@pytest.mark.parametrize(("args", "flag"), [
    ([*INSPECT, "--batch", "1", "--seq", HUGE], "--seq"),
    ([*INSPECT, "--batch", HUGE, "--seq", "8"], "--batch"),
    ([*INSPECT, "--batch", str(2**30), "--seq", str(2**30)], "--batch/--seq"),
    # inside each bound, but attention scores of seq x seq overflow a tensor: traced, then
    # refused as the impossible request it is
    ([*INSPECT, "--batch", str(2**20), "--seq", str(2**20)], "--batch/--seq"),
    ([*INSPECT, "--batch", "1", "--seq", "8", "--link-gbps", "nan"], "--link-gbps"),
    ([*INSPECT, "--batch", "1", "--seq", "8", "--link-gbps", "inf"], "--link-gbps"),
    (["inspect-plan", EXAMPLE, "--mesh", f"tp={HUGE}"], "--mesh"),
    (["inspect-plan", EXAMPLE, "--mesh", f"tp={DIGITS_5000}"], "--mesh"),
    (["generate", "--model", LLAMA, "--tp", HUGE, "-o", "OUT"], "--tp"),
    (["generate", "--model", LLAMA, "--tp", "2", "--ep", HUGE, "-o", "OUT"], "--ep"),
    (["generate", "--model", LLAMA, "--tp", "2", "--cp", HUGE, "-o", "OUT"], "--cp"),
])
def test_impossible_sizes_are_usage_errors(tmp_path, args, flag) -> None:
    args = [tmp_path / "out" if a == "OUT" else a for a in args]
    code, doc = _run(*args)
    assert code == 2, doc
    assert doc["findings"] and all(f["path"] == flag for f in doc["findings"]), doc
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["-5", "0", str(2**60)])
def test_export_max_shard_bytes_must_be_a_size(tmp_path, value) -> None:
    proc = _cli("export", tmp_path / "no_ckpt", "-o", tmp_path / "hf", "--max-shard-bytes",
                value, "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2 and _codes(doc) == ["export.max_shard_bytes"], doc
    assert "Traceback" not in proc.stderr and not (tmp_path / "hf").exists()


LAUNCH = ["launch", EXAMPLE, "--nproc", "2", "--model-dir", LLAMA]


@pytest.mark.parametrize(("extra", "code"), [
    (["--nproc", HUGE], "launch.nproc"),
    (["--steps", HUGE], "launch.steps"),
    (["--seed", str(2**64)], "launch.seed"),
    (["--seed", DIGITS_5000], "cli.usage"),  # click refuses it as an integer
    (["--timeout", "nan"], "launch.timeout"),
    (["--timeout", "inf"], "launch.timeout"),
    (["--tolerance", "inf"], "launch.tolerance"),
    (["--max-grad-norm", "nan"], "launch.max_grad_norm"),
    (["--nnodes", DIGITS_5000], "launch.nnodes"),
])
def test_impossible_launch_requests_are_refused_before_start(extra, code) -> None:
    proc = _cli(*LAUNCH, *extra, "--dry-run", "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert code in _codes(json.loads(proc.stdout))
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("where", ["under_a_file", "under_proc"])
def test_launch_save_under_a_path_that_cannot_be_created_is_refused_before_training(
        tmp_path, where) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    save = blocker / "ckpt" if where == "under_a_file" else Path("/proc/hpcodegen_x/ckpt")
    proc = _cli(*LAUNCH, "--steps", "1", "--save", save, "--log-dir", tmp_path / "logs",
                "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2, doc
    assert _codes(doc) == ["checkpoint.target_unwritable"], doc
    assert not (tmp_path / "logs").exists()  # refused before a run dir or a rank
    assert blocker.read_text() == "x"


def test_export_to_a_path_that_cannot_be_created_is_refused_before_reading(tmp_path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = _cli("export", tmp_path / "no_ckpt", "-o", blocker / "hf", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2 and _codes(doc) == ["checkpoint.target_unwritable"], doc


def test_the_launchers_own_checks_are_under_its_timeout(monkeypatch) -> None:
    """``--timeout`` bounds the pre-start checks: a check that would not end is stopped
    with a launch.timeout finding (here one spinning until the deadline fires)."""
    from hpcodegen.errors import PlanError
    from hpcodegen.launch.launcher.deadline import deadline, left

    spins = 0
    with pytest.raises(PlanError) as raised, deadline(0.2):
        while True:
            spins += 1
    assert [f.code for f in raised.value.findings] == ["launch.timeout"]
    assert spins > 0
    since = time.monotonic()
    assert left(None, since) is None and 0 < left(100.0, since) <= 100.0
    with deadline(None):  # no --timeout: nothing armed
        pass


RECIPE_ARGS = ["generate", "--model", LLAMA, "--tp", "2"]


@pytest.mark.parametrize("text", [
    "- match: x\n  injections: {inner_wrapper: {_target_: a.b, kwargs: {n: "
    + DIGITS_5000 + "}}}\n",
    f"- match: {DIGITS_5000}\n",
    "- match: x\n  " + "9" * 41 + ": 1\n",  # as a key too
    f"- match: x\n  injections: {{inner_wrapper: {{_target_: a.b, kwargs: {{n: {2**63}}}}}}}\n",
    "- match: x\n  injections: {inner_wrapper: {_target_: a.b, kwargs: {n: 0x"
    + "f" * 100 + "}}}\n",
])
def test_a_huge_integer_in_a_recipe_is_one_finding(tmp_path, text) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    code, doc = _run(*RECIPE_ARGS, "--recipe", recipe, "-o", tmp_path / "out")
    assert (code, _codes(doc)) == (2, ["recipe.integer_range"]), doc
    assert doc["findings"][0]["path"].startswith("line ")
    assert not (tmp_path / "out").exists()


def test_yaml_merge_keys_are_supported(tmp_path) -> None:
    """``<<: *base`` merges the anchored rule; the mapping's own keys win over merged
    ones; the result is the same artifact as the rules written out."""
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        "- &attn\n  match: 'model.layers.*.self_attn'\n"
        "  injections: {inner_wrapper: sdpa_hf}\n"
        "- <<: *attn\n  match: 'model.layers.0.self_attn'\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text(
        "- match: 'model.layers.*.self_attn'\n  injections: {inner_wrapper: sdpa_hf}\n"
        "- match: 'model.layers.0.self_attn'\n  injections: {inner_wrapper: sdpa_hf}\n")
    from hpcodegen.generate.sources.recipe import load_recipe

    assert load_recipe(merged) == load_recipe(plain)
    code_a, _ = _run(*RECIPE_ARGS, "--recipe", merged, "-o", tmp_path / "a")
    code_b, _ = _run(*RECIPE_ARGS, "--recipe", plain, "-o", tmp_path / "b")
    assert code_a == code_b == 0
    metas = [json.loads((tmp_path / d / "codegen_meta.json").read_text()) for d in "ab"]
    for key in ("param_plan", "injections"):
        assert metas[0][key] == metas[1][key]
    dup = tmp_path / "dup.yaml"  # an own key twice is still refused
    dup.write_text("- <<: {match: a}\n  match: b\n  match: c\n")
    code, doc = _run(*RECIPE_ARGS, "--recipe", dup, "-o", tmp_path / "c")
    assert (code, _codes(doc)) == (2, ["recipe.duplicate_key"])
    bad = tmp_path / "bad.yaml"  # merging a scalar: not valid YAML, one finding
    bad.write_text("- <<: 5\n  match: b\n")
    code, doc = _run(*RECIPE_ARGS, "--recipe", bad, "-o", tmp_path / "d")
    assert (code, _codes(doc)) == (2, ["recipe.invalid_yaml"])


def test_generate_over_an_old_artifact_keeps_a_user_file_in_its_pycache(tmp_path) -> None:
    out = tmp_path / "art"
    assert _run("generate", "--model", LLAMA, "--tp", "2", "-o", out)[0] == 0
    cache = out / "__pycache__"
    cache.mkdir()
    modeling = next(out.glob("modeling_*_gen_npu.py")).stem
    (cache / f"{modeling}.cpython-311.pyc").write_bytes(b"\0")  # Python's own: replaced
    (cache / "__init__.cpython-311.opt-1.pyc").write_bytes(b"\0")
    code, _ = _run("generate", "--model", LLAMA, "--tp", "2", "-o", out)
    assert code == 0 and not cache.exists()
    cache.mkdir()
    (cache / "my_notes.txt").write_text("mine")
    (cache / "other_module.cpython-311.pyc").write_bytes(b"\1")
    code, doc = _run("generate", "--model", LLAMA, "--tp", "2", "-o", out)
    assert (code, _codes(doc)) == (2, ["generate.out_not_bundle"]), doc
    assert "__pycache__/my_notes.txt" in doc["findings"][0]["message"]
    assert (cache / "my_notes.txt").read_text() == "mine"
    assert (cache / "other_module.cpython-311.pyc").read_bytes() == b"\1"
    shutil.rmtree(cache)


def test_a_hand_edited_meta_cannot_claim_a_user_file_for_deletion(tmp_path) -> None:
    """An old meta's ``outputs`` naming a file whose bytes are not the recorded ones (the
    user's notes): generate did not write it, so ``-o`` refuses instead of deleting it."""
    out = tmp_path / "art"
    assert _run("generate", "--model", LLAMA, "--tp", "2", "-o", out)[0] == 0
    meta = json.loads((out / "codegen_meta.json").read_text())
    meta["outputs"]["notes.md"] = {"lines": 1, "sha256": "0" * 64}
    (out / "codegen_meta.json").write_text(json.dumps(meta))
    (out / "notes.md").write_text("mine\n")
    (out / "helper_gen_npu.py").write_text("mine = 1\n")  # not the modeling file's name
    code, doc = _run("generate", "--model", LLAMA, "--tp", "2", "-o", out)
    assert (code, _codes(doc)) == (2, ["generate.out_not_bundle"]), doc
    message = doc["findings"][0]["message"]
    assert "notes.md" in message and "helper_gen_npu.py" in message
    assert (out / "notes.md").read_text() == "mine\n"
    assert (out / "helper_gen_npu.py").read_text() == "mine = 1\n"
