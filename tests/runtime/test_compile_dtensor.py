"""A model compiled by ``compile_parallelized`` keeps DTensor parameters for torch's tools,
while the compiled graphs see plain local tensors only.

``views_outside`` (:mod:`hpcodegen.runtime.local_views`) swaps each parameter's local alias
in around the compiled call, so dynamo neither takes a DTensor as a graph input nor guards
one (nor the view hooks' objects) on every call. Checked for each case: the guard trees of
the compiled frames name no DTensor and no view-hook object, no graph input is a DTensor, and
the parameters and their gradients are DTensors again after the call. The cases of
:data:`GLOO_CASES` check that on two real gloo ranks, within two compiled training steps
(forward, backward, ``torch.nn.utils.clip_grad_norm_``, AdamW) and a DCP round trip of
``get_model_state_dict`` that give the unsharded eager model's answers (one compile per case
read by both checks); the other cases on the fake process group (one forward and backward).
Each model keeps one decoder layer once parallelized (``one_decoder_layer``: every layer runs
the same boundaries; the compile's work grows with the depth).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from compile_workers import compiled_tools, guarded_dtensor_lines, one_decoder_layer

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5
CASES = [("llama_tp2", "model"), ("llama_tp2_sp", "layers"), ("llama_tp2_sp", "model")]
#: the cases trained on gloo ranks (their guard checks run there); the rest: fake group
GLOO_CASES = CASES[:2]


def _compiled_guards(model, scope, ids) -> tuple[list[str], list[int]]:
    """The guard trees dynamo built and each graph's DTensor input count."""
    import torch
    import torch._dynamo.guards as dynamo_guards
    from torch.distributed.tensor import DTensor

    from hpcodegen.runtime.compile import compile_parallelized

    trees: list[str] = []
    dtensor_inputs: list[int] = []

    def backend(gm, inputs):
        dtensor_inputs.append(sum(isinstance(x, DTensor) for x in inputs))
        return gm.forward

    torch._dynamo.reset()
    # dynamo's own hook for tests: called with each new guard manager
    dynamo_guards.guard_manager_testing_hook_fn = lambda gm, _scope, _b: trees.append(str(gm))
    try:
        compile_parallelized(model, scope, backend=backend)
        model(input_ids=ids).logits.sum().backward()
    finally:
        dynamo_guards.guard_manager_testing_hook_fn = None
    return trees, dtensor_inputs


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("example", "scope"), [c for c in CASES if c not in GLOO_CASES])
def test_compiled_graph_sees_no_dtensor(example, scope, fake_world) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from hpcodegen.hf import load_transformers_config, read_hf_config
    from hpcodegen.launch.rank.model import model_class
    from hpcodegen.runtime import parallelize_from_generated

    artifact = REPO / "examples" / example
    config, _ = read_hf_config(REPO / "examples" / "configs" / "llama")
    hf_config = load_transformers_config(config)
    torch.manual_seed(0)
    model = model_class(artifact, config)(hf_config)
    fake_world(2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    parallelize_from_generated(model, mesh, artifact, hf_config=hf_config)
    one_decoder_layer(model)
    ids = torch.randint(0, hf_config.vocab_size, (2, 16))
    trees, dtensor_inputs = _compiled_guards(model, scope, ids)
    assert trees and dtensor_inputs, "nothing was compiled"
    assert dtensor_inputs == [0] * len(dtensor_inputs), dtensor_inputs
    guarded = guarded_dtensor_lines(trees)
    assert guarded == [], guarded[:5]
    # after the call the module holds its DTensor parameters again, gradients on them
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert all(isinstance(p.grad, DTensor) for p in model.parameters())


@pytest.mark.gloo
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("example", "scope"), GLOO_CASES)
def test_compiled_training_matches_unsharded(gloo, tmp_path, example, scope) -> None:
    for rank, r in enumerate(gloo(2, compiled_tools, example, scope, str(tmp_path / "dcp"))):
        # the compiled graphs see no DTensor: not as an input, not in a guard
        assert r["dtensor_inputs"] and set(r["dtensor_inputs"]) == {0}, (rank, r)
        assert r["guard_trees"] > 0, (rank, "nothing was compiled", r)
        assert r["guarded"] == [], (rank, r["guarded"])
        assert r["params_dtensor"] and r["grads_dtensor"], (rank, r)
        for step in range(2):
            assert r["logits"][step] <= TOL, (rank, step, r)
            assert r["grad"][step][0] <= TOL, (rank, step, r)
            norm, norm_ref = r["norm"][step]
            assert norm > 10 * 0.05, (rank, r)  # the clip really scales
            assert abs(norm - norm_ref) <= TOL * norm_ref, (rank, step, r)
            assert r["step"][step] <= TOL, (rank, step, r)
        assert r["restored"] == 0.0, (rank, r)
