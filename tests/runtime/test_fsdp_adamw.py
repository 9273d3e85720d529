"""One AdamW step on a 2-D mesh (dp=2 x tp=2, 4 gloo ranks) with ``fully_shard`` over dp.

The SP artifact runs the partial-gradient all-reduces of the norms under FSDP2, the bias
artifact the deferred rowwise biases. Loss (averaged over dp), gradients before the step
and parameters after it equal a single-process step on the whole batch within 1e-5.
"""

from __future__ import annotations

import pytest
from rt_workers import fsdp_many

TOL = 1e-5


@pytest.mark.gloo
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_adamw_step_dp2_tp2_matches_single_process(gloo) -> None:
    artifacts = ["llama_tp2_sp", "llama_bias_tp2"]
    results = gloo(4, fsdp_many, artifacts, 2, 2)
    for rank, per_artifact in enumerate(results):
        assert set(per_artifact) == set(artifacts)
        for artifact, r in per_artifact.items():
            assert r["loss"] <= TOL, (rank, artifact, r)
            assert r["grad"][0] <= TOL, (rank, artifact, r)
            assert r["param"][0] <= TOL, (rank, artifact, r)
            assert r["moved"] > 100 * TOL, (rank, artifact, "the step did not move parameters")
