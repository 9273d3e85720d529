"""Collectives per forward and backward, counted by CommDebugMode on the fake process group,
equal what inspect-plan predicts (``hpcodegen.plan.predict``) for each example artifact.

The gradient all-reduces of partial parameters are not boundary transitions: predict.py
counts them apart (``Summary.grad_sync``, from ``effective_partial_grad_params``) and the
expected backward adds them.
"""

from __future__ import annotations

import pytest
from rt_workers import EXAMPLES, batch, build_pair, hf_config

from hpcodegen.parity.harness import count_collectives, predicted_collectives
from hpcodegen.plan.codec import plan_from_meta

ARTIFACTS = ["llama_tp2", "llama_tp2_sp", "qwen3_tp2", "qwen3_tp2_sp", "llama_bias_tp2",
             "llama_tp2_sp_lp"]


@pytest.mark.timeout(400)
@pytest.mark.filterwarnings("ignore:.*backward hook:UserWarning")
@pytest.mark.filterwarnings("ignore:For backward hooks:UserWarning")
def test_counts_match_prediction(fake_world) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.artifact.load import load_meta
    from hpcodegen.runtime import parallelize_from_generated

    fake_world(2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    seen = {}
    for artifact in ARTIFACTS:
        _, model = build_pair(artifact)
        parallelize_from_generated(model, mesh, EXAMPLES / artifact,
                                   hf_config=hf_config(artifact))
        ids, _ = batch(model.config.vocab_size)
        with count_collectives() as fwd:
            logits = model(input_ids=ids, use_cache=False).logits
        with count_collectives() as bwd:
            logits.float().sum().backward()
        plan = plan_from_meta(load_meta(EXAMPLES / artifact).data)
        want_fwd, want_bwd = predicted_collectives(plan)
        seen[artifact] = (fwd, bwd, want_fwd, want_bwd)
    for artifact, (fwd, bwd, want_fwd, want_bwd) in seen.items():
        assert fwd == want_fwd, (artifact, "forward", fwd, want_fwd)
        assert bwd == want_bwd, (artifact, "backward", bwd, want_bwd)
    # the SP variants really run sequence-parallel collectives
    assert seen["llama_tp2_sp"][0]["reduce_scatter"] > 0
    assert seen["llama_tp2"][0]["reduce_scatter"] == 0
    # loss parallel: the same plan as llama_tp2_sp less the logits all_gather, both ways
    assert seen["llama_tp2_sp_lp"][0]["all_gather"] == seen["llama_tp2_sp"][0]["all_gather"] - 1


@pytest.mark.timeout(400)
@pytest.mark.filterwarnings("ignore:.*backward hook:UserWarning")
@pytest.mark.filterwarnings("ignore:For backward hooks:UserWarning")
def test_grad_allreduce_special_handler_adds_one_backward_all_reduce(tmp_path, fake_world) -> None:
    """The built-in ``replicated_with_grad_allreduce`` handler sums one more gradient."""
    from rt_artifacts import copy_artifact
    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.runtime import parallelize_from_generated

    def edit(meta):
        meta["special_handlers"] = {"model.norm.weight": "replicated_with_grad_allreduce"}
    art = copy_artifact("llama_tp2", tmp_path / "handler", edit)
    fake_world(2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    counts = []
    for path in (EXAMPLES / "llama_tp2", art):
        _, model = build_pair("llama_tp2")
        parallelize_from_generated(model, mesh, path)
        logits = model(input_ids=batch(256)[0], use_cache=False).logits
        with count_collectives() as seen:
            logits.sum().backward()
        counts.append(seen["all_reduce"])
    assert counts[1] == counts[0] + 1
