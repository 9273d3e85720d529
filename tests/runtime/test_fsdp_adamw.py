"""One AdamW step on a 2-D mesh (dp=2 x tp=2, 4 gloo ranks) with ``fully_shard`` over dp.

The SP artifact is used so the partial-gradient all-reduces of the norms run under FSDP2
too. Loss (averaged over dp), gradients before the step and parameters after it equal a
single-process step on the whole batch within 1e-5.
"""

from __future__ import annotations

import pytest
from rt_workers import fsdp_adamw_step, spawn

TOL = 1e-5


@pytest.mark.gloo
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_adamw_step_dp2_tp2_matches_single_process(tmp_path) -> None:
    results = spawn(4, fsdp_adamw_step, "llama_tp2_sp", 2, 2, out_dir=str(tmp_path))
    for rank, r in enumerate(results):
        assert r["loss"] <= TOL, (rank, r)
        assert r["grad"][0] <= TOL, (rank, r)
        assert r["param"][0] <= TOL, (rank, r)
        assert r["moved"] > 100 * TOL, (rank, "the step did not move the parameters")
