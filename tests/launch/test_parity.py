"""The shipped llama tp=2 example on two real gloo ranks: parity with the unsharded model."""

from __future__ import annotations

import pytest
from launch_helpers import EXAMPLE, LLAMA_CONFIG, run_cli

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


@pytest.mark.timeout(150)
def test_check_parity_two_ranks():
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--check-parity", "--json", timeout=140)
    assert run.code == 0, run.stdout + run.stderr
    _check(run.json(), steps=0)


@pytest.mark.timeout(150)
def test_check_parity_with_three_steps():
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--check-parity", "--steps", "3", "--json", timeout=140)
    assert run.code == 0, run.stdout + run.stderr
    _check(run.json(), steps=3)


@pytest.mark.timeout(150)
def test_text_report_and_tolerance_failure():
    """The same job with an impossible tolerance: the check fails (exit 1) and says why."""
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--check-parity", "--tolerance", "1e-30", timeout=140)
    assert run.code == 1
    assert "rank 0 check failed: parity logits max diff" in run.stderr
    for column in ("local params", "forward", "logits diff", "grad diff", "status"):
        assert column in run.stdout.replace("\n", " ") or column.split()[0] in run.stdout
