"""The shipped llama tp=2 example on two real gloo ranks: parity with the unsharded model.

The text-mode ``--check-parity`` run is a real launch (the `make demo` command); the three
AdamW steps run launch's rank job on the session's kept gloo ranks (``launch_gloo``), and
what a passing ``--json`` launch reports of its scratch dir is checked on the real JSON
launch of ``test_compile_loss_parallel.py``.
"""

from __future__ import annotations

import json

import pytest
from launch_gloo import gloo_launch, ok_doc, rank_env
from launch_helpers import EXAMPLE, LLAMA_CONFIG, check_in_process, run_cli

pytestmark = pytest.mark.gloo


def _check(doc: dict, steps: int) -> None:
    assert doc["status"] == "ok", doc["message"]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for rank in doc["ranks"]:
        parity = rank["parity"]
        assert rank["status"] == "ok" and rank["device"] == "cpu"
        assert parity["mismatched_params"] == []
        assert 0 <= parity["logits_max_diff"] <= 1e-5
        assert 0 <= parity["grad_max_diff"] <= 1e-5
        assert rank["local_param_bytes"] > 0 and rank["forward_ms"] > 0
        assert len(rank["losses"]) == steps
    full = doc["ranks"][0]
    if steps:
        assert full["losses"] == pytest.approx(full["ref_losses"], abs=1e-5)
        assert full["losses"][-1] < full["losses"][0]  # AdamW on a fixed batch learns it
        assert doc["ranks"][0]["parity"]["loss_max_diff"] <= 1e-5


@pytest.mark.timeout(400)
def test_check_parity_two_ranks(tmp_path):
    """Text mode (the `make demo` command); the numbers come from the kept result files."""
    check_in_process(EXAMPLE, LLAMA_CONFIG)  # the launch reads the verdict: no check child
    run = run_cli(EXAMPLE, "--nproc", "2", "--model-dir", LLAMA_CONFIG, "--check-parity",
                  "--log-dir", tmp_path, timeout=300)
    assert run.code == 0, run.stdout + run.stderr
    for column in ("rank", "device", "local params", "forward", "logits diff", "grad diff",
                   "status"):
        assert column in run.stdout
    assert "loss" not in run.stdout.split("all 2 ranks ok")[0]  # no --steps: no loss column
    assert "all 2 ranks ok" in run.stdout and "tolerance 1e-05" in run.stdout
    ranks = [json.loads((tmp_path / "results" / f"rank{r}.json").read_text()) for r in (0, 1)]
    _check({"status": "ok", "message": run.stdout, "ranks": ranks}, steps=0)
    assert (tmp_path / "torchrun.log").is_file()
    assert sorted(p.parent.name for p in tmp_path.glob("*/attempt_0/*/stderr.log")) == ["0", "1"]


@pytest.mark.timeout(400)
def test_check_parity_with_three_steps(gloo):
    docs = gloo_launch(gloo, 2, {"three_steps": rank_env(EXAMPLE, LLAMA_CONFIG, 2, steps=3,
                                                         check_parity=True)})
    _check({"status": "ok", **ok_doc(docs, "three_steps")}, steps=3)
