"""Eight real gloo ranks (opt-in: ``pytest -m world8``): dp=2 x tp=4 from the tp=4 example."""

from __future__ import annotations

import pytest
from launch_helpers import LLAMA_CONFIG, REPO, check_in_process, run_cli

pytestmark = [pytest.mark.gloo, pytest.mark.world8]


@pytest.mark.timeout(420)
def test_llama_tp4_on_eight_ranks_dp2():
    check_in_process(REPO / "examples" / "llama_tp4", LLAMA_CONFIG)  # no check child
    run = run_cli(REPO / "examples" / "llama_tp4", "--nproc", "8", "--device", "cpu",
                  "--model-dir", LLAMA_CONFIG, "--check-parity", "--steps", "2", "--json",
                  timeout=400)
    assert run.code == 0, run.stdout + run.stderr
    doc = run.json()
    assert [r["rank"] for r in doc["ranks"]] == list(range(8))
    for rank in doc["ranks"]:
        assert rank["status"] == "ok"
        assert rank["parity"]["logits_max_diff"] <= 1e-5
        assert rank["parity"]["grad_max_diff"] <= 1e-5
