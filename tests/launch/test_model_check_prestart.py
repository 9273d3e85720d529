"""launch runs verify's model check in a child process before any rank starts (issue 34).

A meta whose schema, plan and signature checks pass but whose declared placements the
derivation contradicts is refused with exit 1 and the model check's findings, with no rank
started; ``--timeout`` covers that child (it is killed, and nothing starts).

The child's pass, its refusal through a launch, and the verdict cache's end to end case
(a pass recorded, the meta then changed, the launch checks again and is refused) read one
sequence of two children (:func:`pass_then_refusal`), each asserted by its own test.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_helpers import EXAMPLE, LLAMA_CONFIG, CliRun, run_cli

from hpcodegen.artifact.digest import meta_signature
from hpcodegen.errors import HpcodegenError
from hpcodegen.launch.launcher.check_cache import CACHE_ENV
from hpcodegen.launch.launcher.deadline import PreStartTimeout
from hpcodegen.launch.launcher.model_check import cached_model_check, run_model_check

CONFIG = LLAMA_CONFIG / "config.json"


def _row_split_head(art: Path) -> None:
    """lm_head's weight split on its input dim: the signature and files stay consistent, so
    only the derivation (the output is then partial, declared replicated) can refuse it."""
    meta = json.loads((art / "codegen_meta.json").read_text())
    meta["param_plan"]["lm_head"]["params"]["weight"]["tp"] = "S(1)"
    meta["signature"] = meta_signature(meta)
    (art / "codegen_meta.json").write_text(json.dumps(meta, indent=2))


@dataclass
class PassThenRefusal:
    """What :func:`pass_then_refusal` saw, in order, for the tests to assert."""

    cache: Path
    logs: Path
    before_pass: list | None  # the cache's answer before the pass: None, nothing recorded
    passed: list | HpcodegenError  # the child's warnings on the example's bytes (or why not)
    after_pass: list | None  # the cache's answer after it: the pass, recorded
    without_cache: list | None  # no cache: None, always checked
    after_change: list | None  # the cache's answer for the changed meta: None
    launch: CliRun  # the launch of the changed meta (its child refuses it)
    after_refusal: list | None  # the cache's answer after the refusal: None
    records: int  # verdict files in the cache at the end


@pytest.fixture(scope="module")
def pass_then_refusal(tmp_path_factory: pytest.TempPathFactory) -> PassThenRefusal:
    """Two model-check children in all, each the subject of a test: the child passes the
    example's bytes (recorded in a fresh verdict cache), then lm_head is row-split in
    place (:func:`_row_split_head`) and a launch of it, with that cache, runs the check
    again, which refuses it: exit 1 with the findings, no rank, nothing recorded.

    Shared by three tests (the pass, the refusal with no rank started, and the verdict
    cache's "a meta changed after its pass is checked again"), which each ran the same
    child on the same bytes before: one pass child and one refusing launch fewer."""
    tmp = tmp_path_factory.mktemp("model_check")
    art, cache, logs = tmp / "llama_tp2", tmp / "cache", tmp / "logs"
    shutil.copytree(EXAMPLE, art)
    config = tmp / "config" / "config.json"
    config.parent.mkdir()
    shutil.copyfile(CONFIG, config)
    before_pass = cached_model_check(art, config, (), cache)
    try:  # a refusal of the good bytes fails the pass's own test, by name
        passed: list | HpcodegenError = run_model_check(art, config, timeout=300, cache=cache)
    except HpcodegenError as exc:
        passed = exc
    after_pass = cached_model_check(art, config, (), cache)
    without_cache = cached_model_check(art, config, (), None)
    _row_split_head(art)
    after_change = cached_model_check(art, config, (), cache)
    launch = run_cli(art, "--nproc", "2", "--device", "cpu", "--model-dir", config.parent,
                     "--log-dir", logs, "--json", timeout=300, env={CACHE_ENV: str(cache)})
    return PassThenRefusal(cache, logs, before_pass, passed, after_pass, without_cache,
                           after_change, launch, cached_model_check(art, config, (), cache),
                           len(list(cache.glob("*.json"))))


@pytest.mark.timeout(400)
def test_a_meta_the_derivation_refuses_starts_no_rank(pass_then_refusal) -> None:
    run, logs = pass_then_refusal.launch, pass_then_refusal.logs
    assert run.code == 1, (run.stdout, run.stderr)
    doc = run.json()
    codes = {f["code"] for f in doc["findings"]}
    assert "model.leaf_output" in codes, doc
    # the child's own finding (its PlanError's, as launch reports it) names lm_head; the
    # same bytes are not run through a second child to see it raised directly
    assert any(f["code"] == "model.leaf_output" and "lm_head" in f"{f['path']}{f['message']}"
               for f in doc["findings"]), doc
    assert all(f["severity"] != "info" for f in doc["findings"])
    assert doc.get("pids") in (None, [])
    assert not (logs / "results").exists() or not any((logs / "results").iterdir())


@pytest.mark.timeout(400)
def test_the_child_passes_a_good_artifact(pass_then_refusal) -> None:
    """The example's bytes (copied: the refusal then edits the copy), judged by a child
    that nothing recorded before it could skip."""
    assert pass_then_refusal.before_pass is None
    assert pass_then_refusal.passed == []


@pytest.mark.timeout(400)
def test_a_meta_changed_after_its_pass_was_recorded_is_checked_again_and_refused(
        pass_then_refusal) -> None:
    """The verdict cache's own end to end case (``test_check_cache.py`` holds the others):
    the pass is recorded, the meta then changes by one entry, and the launch of it runs
    the check again and is refused by it (nothing recorded, no rank)."""
    seen = pass_then_refusal
    assert seen.after_pass == []  # recorded: the next launch of these bytes skips
    assert seen.without_cache is None  # no cache: always checked
    assert seen.after_change is None
    assert seen.launch.code == 1, (seen.launch.stdout, seen.launch.stderr)
    doc = seen.launch.json()
    assert "model.leaf_output" in {f["code"] for f in doc["findings"]}, doc
    assert doc.get("pids") in (None, [])
    assert seen.after_refusal is None  # a refusal is not recorded
    assert seen.records == 1


@pytest.mark.timeout(400)
def test_timeout_kills_the_model_check_and_starts_nothing(tmp_path) -> None:
    # the child imports torch and transformers and derives the plan: far over 0.2 s
    with pytest.raises(PreStartTimeout) as caught:
        run_model_check(EXAMPLE, LLAMA_CONFIG / "config.json", timeout=0.2)
    assert "model check" in caught.value.findings[0].message
    # the verdict cache off: the suite's other launches may have recorded a pass for EXAMPLE
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--timeout", "1", "--json", timeout=300, env={CACHE_ENV: "off"})
    assert run.code == 1, (run.stdout, run.stderr)
    doc = run.json()
    assert [f["code"] for f in doc["findings"]] == ["launch.timeout"], doc
    assert doc.get("pids") in (None, [])
