"""Deferred biases on one process: refusals name the FQN and the meta field; the bias is
hidden from the layer and added once after the boundary's outputs (no process group: the
entries here have no tp-sharded output, so nothing communicates)."""

from __future__ import annotations

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.plan.classify import classify_boundary

AXES = ("tp",)


def _active():
    from hpcodegen.runtime.mesh import ActiveMesh

    return ActiveMesh(AXES, {"tp": 2}, None, None)


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


def _entry(paths: list[str]) -> dict:
    return {"params": {}, "in_src": {"hidden_states": {"tp": "R"}},
            "in_dst": {"hidden_states": {"tp": "R"}}, "out_src": {"output": {"tp": "R"}},
            "out_dst": {"output": {"tp": "R"}}, "deferred_bias_params": paths}


@pytest.mark.parametrize("path", ["nope.bias", "o_proj.nope"])
def test_a_missing_module_or_parameter_is_a_plan_error_naming_fqn_and_field(path) -> None:
    from hpcodegen.runtime.boundaries import install_deferred_bias

    entry = _entry([path])
    form = classify_boundary("model.layers.0.attn", entry, AXES)
    with pytest.raises(PlanError) as info:
        install_deferred_bias(_Block.build(), "model.layers.0.attn", entry, form, _active())
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
    form = classify_boundary("m", entry, AXES)
    before = inspect.signature(module.forward)
    hook = install_deferred_bias(module, "m", entry, form, _active())
    x = torch.randn(3, 4)
    bare = x @ block.o_proj.weight.T
    torch.testing.assert_close(module(x), bare)
    torch.testing.assert_close(hook(module(x)), bare + block.o_proj.bias)
    assert inspect.signature(module.forward) == before
    assert block.o_proj.bias is not None  # restored after each call
