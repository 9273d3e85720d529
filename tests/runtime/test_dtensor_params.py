"""Parameters are DTensors with the plan's placements, so torch's own tools give the
unsharded model's answers unchanged: ``full_tensor()`` of every gradient,
``torch.nn.utils.clip_grad_norm_``, ``p.grad.norm()``, AdamW, a DCP round trip of
``get_model_state_dict``, and FSDP2 over dp of a (dp, tp) mesh. Real gloo ranks against the
unsharded transformers model (sequence parallelism included: its norms' partial gradients,
summed by hooks that must survive the ``module.to`` that swaps DTensor parameters).

Also one AdamW step on the 2-D mesh (dp 2 x tp 2, 4 gloo ranks) with ``fully_shard`` over
dp: the SP artifact runs the partial-gradient all-reduces of the norms under FSDP2, the bias
artifact the deferred rowwise biases; loss (averaged over dp), gradients before the step and
parameters after it equal a single-process step on the whole batch. The 4-rank tests follow
the 2-rank ones in one module: a fresh world's ranks import the model code again, and the
session keeps a 2-rank and a 4-rank world alive side by side (``tests/conftest.py``,
``KEPT_RANKS``), so each starts once."""

from __future__ import annotations

import pytest
from dtensor_workers import fsdp_tools, torch_tools
from rt_workers import fsdp_many

TOL = 1e-5
ARTIFACTS = ("llama_tp2", "llama_tp2_sp")


@pytest.mark.gloo
@pytest.mark.timeout(400)
@pytest.mark.parametrize("artifact", ARTIFACTS)
def test_torch_tools_on_dtensor_parameters(gloo, tmp_path, artifact) -> None:
    results = gloo(2, torch_tools, artifact, str(tmp_path / "dcp"))
    for rank, r in enumerate(results):
        assert r["wrong_placements"] == [], (rank, r)
        assert r["sharded"] > 0, (rank, r)  # a tp plan splits some parameters
        assert r["swapped"] > 0, (rank, r)  # module.to swapped them: hooks re-attached
        assert r["logits"] <= TOL, (rank, r)
        assert r["grad"] <= TOL, (rank, r)
        assert r["norm"] > 10 * 0.05, (rank, r)  # the clip below really scales
        assert abs(r["norm"] - r["norm_ref"]) <= TOL * r["norm_ref"], (rank, r)
        assert r["p_grad_norm"] <= TOL, (rank, r)
        assert r["clipped"] <= TOL, (rank, r)
        assert r["step"] <= TOL, (rank, r)
        assert r["restored"] == 0.0, (rank, r)


@pytest.mark.gloo
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("artifact", ARTIFACTS)
def test_fsdp2_over_dp_on_dtensor_parameters(gloo, artifact) -> None:
    for rank, r in enumerate(gloo(4, fsdp_tools, artifact)):
        assert r["on_2d"], (rank, r)
        assert r["grad"] <= TOL, (rank, r)
        assert abs(r["norm"] - r["norm_ref"]) <= TOL * r["norm_ref"], (rank, r)
        assert r["step"] <= TOL, (rank, r)


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
