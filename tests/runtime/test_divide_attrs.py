"""``tp_divide_attrs`` through a shared non-module holder (transformers' config object).

xLSTM's mLSTM layer reshapes by ``self.config.num_heads``, the config every module of the
model shares: the runtime divides a private copy of it on the layer (one copy per module,
made once), so the model's config, the recurrent cache sized from it and the other layers
keep the full count.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch import nn

from hpcodegen.errors import PlanError
from hpcodegen.plan.codec import plan_from_meta
from hpcodegen.plan.types import Plan
from hpcodegen.runtime.params import divide_attrs


class Layer(nn.Module):
    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        self.config = config
        self.inner = nn.Linear(2, 2)
        self.v_dim = 8


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(num_heads=4, hidden=16)
        self.layers = nn.ModuleList([Layer(self.config) for _ in range(2)])


def _meta(*attrs: str) -> Plan:
    return plan_from_meta(
        {"param_plan": {f"layers.{i}": {"tp_divide_attrs": list(attrs)} for i in range(2)}})


def test_a_count_in_a_shared_config_is_divided_on_each_layers_own_copy() -> None:
    model = Model()
    shared = model.config
    divide_attrs(model, _meta("config.num_heads", "v_dim"), SimpleNamespace(tp_size=2))
    for layer in model.layers:
        assert layer.config is not shared and layer.config.num_heads == 2
        assert layer.config.hidden == 16 and layer.v_dim == 4
    assert model.layers[0].config is not model.layers[1].config
    assert shared.num_heads == 4 and model.config is shared


def test_two_counts_of_one_config_share_the_layers_one_copy() -> None:
    model = Model()
    meta = plan_from_meta({"param_plan": {"layers.0": {"tp_divide_attrs": [
        "config.num_heads", "config.hidden"]}}})
    divide_attrs(model, meta, SimpleNamespace(tp_size=2))
    assert (model.layers[0].config.num_heads, model.layers[0].config.hidden) == (2, 8)
    assert (model.config.num_heads, model.layers[1].config.num_heads) == (4, 4)


def test_a_missing_or_indivisible_config_count_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="missing attribute"):
        divide_attrs(Model(), _meta("config.num_kv"), SimpleNamespace(tp_size=2))
    with pytest.raises(PlanError, match="num_heads = 4 is not divisible by tp_size = 3"):
        divide_attrs(Model(), _meta("config.num_heads"), SimpleNamespace(tp_size=3))


def test_every_count_is_checked_before_any_is_divided() -> None:
    """The runtime applies generate's and verify's rule to all counts first: one that tp
    cannot divide refuses the plan (naming each) and leaves the model as it was."""
    model = Model()
    model.layers[1].v_dim = 6
    with pytest.raises(PlanError) as info:
        divide_attrs(model, _meta("v_dim", "config.num_heads"), SimpleNamespace(tp_size=4))
    assert [f.where for f in info.value.findings] == ["layers.1.v_dim"]
    assert info.value.findings[0].expected == "a multiple of 4"
    assert [layer.v_dim for layer in model.layers] == [8, 6]
    assert [layer.config.num_heads for layer in model.layers] == [4, 4]
