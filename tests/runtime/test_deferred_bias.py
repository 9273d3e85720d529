"""Deferred biases on one process: refusals name the FQN and the meta field; the bias is
hidden from the layer and added once after the boundary's outputs (no process group)."""

from __future__ import annotations

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.plan.codec import entry_from_json
from hpcodegen.plan.types import PlanEntry


class _Block:
    """A module with an ``o_proj`` child holding a bias (built lazily: torch import)."""

    @staticmethod
    def build():
        from torch import nn

        class Block(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.o_proj = nn.Linear(4, 4)

            def forward(self, hidden_states):
                return self.o_proj(hidden_states)
        return Block()


def _entry(paths: list[str]) -> PlanEntry:
    return entry_from_json("m", {
        "params": {}, "in_src": {"hidden_states": {"tp": "R"}},
        "in_dst": {"hidden_states": {"tp": "R"}}, "out_src": {"output": {"tp": "R"}},
        "out_dst": {"output": {"tp": "R"}}, "deferred_bias_params": paths})


@pytest.mark.parametrize("path", ["nope.bias", "o_proj.nope"])
def test_a_missing_module_or_parameter_is_a_plan_error_naming_fqn_and_field(path) -> None:
    from hpcodegen.runtime.boundaries import install_deferred_bias

    entry = _entry([path])
    with pytest.raises(PlanError) as info:
        install_deferred_bias(_Block.build(), "model.layers.0.attn", entry)
    finding = info.value.findings[0]
    assert finding.code == "runtime.missing_param"
    assert finding.where == f"model.layers.0.attn.{path}"
    assert "deferred_bias_params" in finding.message


@pytest.mark.parametrize("path", ["bias", "o_proj.bias"])
def test_the_bias_is_hidden_from_the_layer_and_added_once_by_the_hook(path) -> None:
    """The boundary's own bias (a wrapped ``nn.Linear``) and a child's take one path; the
    wrapped forward keeps its signature, so inputs still bind by name."""
    import inspect

    import torch

    from hpcodegen.runtime.boundaries import install_deferred_bias

    block = _Block.build()
    module = block.o_proj if path == "bias" else block
    entry = _entry([path])
    before = inspect.signature(module.forward)
    hook = install_deferred_bias(module, "m", entry)
    x = torch.randn(3, 4)
    bare = x @ block.o_proj.weight.T
    torch.testing.assert_close(module(x), bare)
    torch.testing.assert_close(hook(module(x)), bare + block.o_proj.bias)
    assert inspect.signature(module.forward) == before
    assert block.o_proj.bias is not None  # restored after each call


def _region(out_tp: str, declared: list[str] | None) -> dict:
    entry = {"params": {"o_proj.weight": {"tp": "S(1)"}, "o_proj.bias": {"tp": "R"}},
             "in_src": {"hidden_states": {"tp": out_tp}}, "in_dst": {"hidden_states": {"tp": "R"}},
             "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": out_tp}},
             "deferred_bias_params": ["o_proj.bias"]}
    if declared is not None:
        entry["partial_grad_params"] = declared
    return entry


@pytest.mark.parametrize(("out_tp", "declared", "want"), [
    ("S(1)", None, ("o_proj.bias",)),          # another generator: derived
    ("S(1)", ["o_proj.bias"], ("o_proj.bias",)),  # ours: declared, not counted twice
    ("R", None, ()),                           # all_reduced output: the bias is whole
    ("S(1)", ["norm.weight"], ("norm.weight", "o_proj.bias")),
])
def test_effective_partial_grads_add_a_deferred_bias_on_a_sharded_output(
        out_tp, declared, want) -> None:
    from hpcodegen.plan.codec import entry_from_json

    entry = entry_from_json("attn", _region(out_tp, declared))
    assert entry.effective_partial_grad_params() == want


def test_inspect_plan_counts_the_derived_sync_the_runtime_installs() -> None:
    """Regression: a meta without ``partial_grad_params`` for its SP deferred bias was
    synced by the runtime but predicted without that backward all_reduce."""
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.plan.predict import predict_plan, summarize
    from hpcodegen.runtime.install import _partial_grad_fqns

    meta = {"mesh_dim_names": ["tp"], "parallel_dims": {"tp_size": 2},
            "param_plan": {"model.layers.0.self_attn": _region("S(1)", None),
                           "model.layers.1.self_attn": _region("R", None)}}
    preds = predict_plan(plan_from_meta(meta))
    assert summarize(preds).grad_sync == {("all_reduce", "tp", None): 1}
    assert _partial_grad_fqns(plan_from_meta(meta)) == ["model.layers.0.self_attn.o_proj.bias"]
