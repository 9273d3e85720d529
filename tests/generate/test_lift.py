"""Lifting HF per-Linear styles to boundaries, for the pre-5.1 and the 5.1+ style names."""

from __future__ import annotations

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.generate.layouts.lift import lift_plan
from hpcodegen.generate.sources.hf_plan import expand_rules, hf_rules
from hpcodegen.hf import read_hf_config
from hpcodegen.plan.draft import entries_to_json

pytestmark = pytest.mark.slow

OLD_STYLE = [  # transformers < 5.1 spelling, with the MLP as gather + local shards
    ("model.embed_tokens", "embedding_rowwise"),
    ("model.layers.*.self_attn.q_proj", "colwise"),
    ("model.layers.*.self_attn.k_proj", "colwise"),
    ("model.layers.*.self_attn.v_proj", "colwise"),
    ("model.layers.*.self_attn.o_proj", "rowwise_rep"),
    ("model.layers.*.mlp", "gather"),
    ("model.layers.*.mlp.gate_proj", "local_colwise"),
    ("model.layers.*.mlp.up_proj", "local_colwise"),
    ("model.layers.*.mlp.down_proj", "local_rowwise"),
    ("model.norm", "sequence_parallel"),
    ("lm_head", "colwise_rep"),
]


@pytest.fixture(scope="module")
def llama(llama_dir):
    from hpcodegen.hf import build_meta_model

    config, _ = read_hf_config(llama_dir)
    return build_meta_model(config)


def _lift(model, rules, sp):
    fqns = [name for name, _ in model.named_modules()]
    return entries_to_json(lift_plan(model, expand_rules(rules, fqns), sp).view())


@pytest.mark.parametrize("sp", [False, True])
def test_old_and_new_style_names_lift_to_the_same_plan(llama, sp: bool) -> None:
    new = _lift(llama, hf_rules(llama), sp)
    old = _lift(llama, OLD_STYLE, sp)
    assert old == new
    attn = new["model.layers.1.self_attn"]
    assert attn["params"]["o_proj.weight"] == {"tp": "S(1)"}
    assert attn["in_src"] == {"hidden_states": {"tp": "S(1)" if sp else "R"}}
    assert attn["out_dst"] == {"output": {"tp": "S(1)" if sp else "R"}}
    assert new["model.layers.0.mlp"]["in_src"] == {"x": {"tp": "S(1)" if sp else "R"}}
    assert new["lm_head"]["out_src"] == {"output": {"tp": "S(-1)"}}
    norm = new["model.layers.0.input_layernorm"]
    assert norm["params"] == {"weight": {"tp": "R"}}
    assert ("partial_grad_params" in norm) is sp


def test_colwise_without_rowwise_sibling_is_refused(llama) -> None:
    rules = [("model.layers.*.mlp.gate_proj", "colwise")]
    with pytest.raises(PlanError, match=r"model\.layers\.0\.mlp has no rowwise child"):
        _lift(llama, rules, False)


def test_packed_colwise_is_strided(llama) -> None:
    rules = [("model.layers.*.mlp.gate_proj", "packed_colwise"),
             ("model.layers.*.mlp.down_proj", "rowwise")]
    plan = _lift(llama, rules, False)
    assert plan["model.layers.0.mlp"]["params"]["gate_proj.weight"] == {"tp": "SS(0,2)"}


def test_tied_embeddings_recorded(tmp_path, make_config) -> None:
    import json

    from hpcodegen.generate.api import build_bundle

    model = make_config(tmp_path / "tied", "llama", tie_word_embeddings=True)
    config = json.loads((model / "config.json").read_text())
    meta = json.loads(build_bundle(config, 2, False, None, "tied")["codegen_meta.json"])
    assert meta["tied_pairs"] == [["model.embed_tokens.weight", "lm_head.weight"]]
    assert meta["source"]["structure"]["tie_word_embeddings"] is True


def test_second_rowwise_child_in_a_region_is_refused(llama) -> None:
    # a region reduces its output once: a second rowwise child's partial output would be
    # used inside the forward unreduced (Doge's dt_proj feeding a per-head mask)
    rules = [("model.layers.*.mlp.gate_proj", "colwise"),
             ("model.layers.*.mlp.up_proj", "rowwise"),
             ("model.layers.*.mlp.down_proj", "rowwise")]
    with pytest.raises(PlanError, match=r"model\.layers\.0\.mlp has 2 rowwise children "
                                        r"\(down_proj, up_proj\).*not exact"):
        _lift(llama, rules, False)


def _pretrained(name: str, children: dict | None = None, prefix: str = "model"):
    """A module that looks like a transformers model: ``base_model_prefix`` and a config."""
    from torch import nn

    cls = type(name, (nn.Module,), {"base_model_prefix": prefix})
    module = cls()
    module.config = type("Cfg", (), {"base_model_tp_plan": {"layers.*.proj": "colwise"}})()
    for child_name, child in (children or {}).items():
        module.add_module(child_name, child)
    return module


def test_the_base_plan_is_prefixed_where_the_base_model_actually_sits() -> None:
    """``base_model_prefix`` when the model holds it; else the one inner transformers
    model (Llama-4's causal LM: prefix ``language_model``, decoder held as ``model``)."""
    from torch import nn

    from hpcodegen.generate.sources.hf_plan import base_model_fqn

    by_prefix = _pretrained("ForCausalLM", {"model": _pretrained("Base"),
                                            "lm_head": nn.Linear(2, 2)})
    elsewhere = _pretrained("ForCausalLM", {"model": _pretrained("Base")}, "language_model")
    assert base_model_fqn(by_prefix) == "model" and base_model_fqn(elsewhere) == "model"
    assert hf_rules(elsewhere) == [("model.layers.*.proj", "colwise")]
    # the model is its own base model (no inner model), or the inner one is ambiguous
    alone = _pretrained("Base", {"layers": nn.ModuleList([nn.Linear(2, 2)])}, "language_model")
    two = _pretrained("Composite", {"a": _pretrained("A"), "b": _pretrained("B")}, "x")
    assert base_model_fqn(alone) == "" and base_model_fqn(two) == ""
    assert hf_rules(alone) == [("layers.*.proj", "colwise")]
