"""launch runs verify's model check in a child process before any rank starts (issue 34).

A meta whose schema, plan and signature checks pass but whose declared placements the
derivation contradicts is refused with exit 1 and the model check's findings, with no rank
started; ``--timeout`` covers that child (it is killed, and nothing starts).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_helpers import EXAMPLE, LLAMA_CONFIG, run_cli

from hpcodegen.artifact.digest import meta_signature
from hpcodegen.launch.launcher.check_cache import CACHE_ENV
from hpcodegen.launch.launcher.deadline import PreStartTimeout
from hpcodegen.launch.launcher.model_check import run_model_check


def _row_split_head(tmp: Path) -> Path:
    """lm_head's weight split on its input dim: the signature and files stay consistent, so
    only the derivation (the output is then partial, declared replicated) can refuse it."""
    art = tmp / "llama_tp2"
    shutil.copytree(EXAMPLE, art)
    meta = json.loads((art / "codegen_meta.json").read_text())
    meta["param_plan"]["lm_head"]["params"]["weight"]["tp"] = "S(1)"
    meta["signature"] = meta_signature(meta)
    (art / "codegen_meta.json").write_text(json.dumps(meta, indent=2))
    return art


@pytest.mark.timeout(400)
def test_a_meta_the_derivation_refuses_starts_no_rank(tmp_path) -> None:
    art = _row_split_head(tmp_path)
    logs = tmp_path / "logs"
    run = run_cli(art, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--log-dir", logs, "--json", timeout=300)
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
def test_the_child_passes_a_good_artifact() -> None:
    """The refusal's findings are checked on the launch above (the same child, the same
    bytes): one child for the pass, none run twice."""
    assert run_model_check(EXAMPLE, LLAMA_CONFIG / "config.json", timeout=300) == []


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
