"""generate on configs that used to crash or be refused for reasons other than missing rules.

Each test is one general rule: a composite config builds its text sub-config's class (as
transformers does), a config transformers cannot build is refused naming transformers'
reason, HF's NaN/Infinity read, an HF rule matching no module is a note, tied parameters get
one placement, and HF's ``local_params`` / ``mla_kv_a_proj`` styles lift. Tiny configs in
tests/fixtures/families (``bench/coverage.py``'s shrinking).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from artifact_memo import build_bundle

from hpcodegen.errors import PlanError
from hpcodegen.generate import api
from hpcodegen.generate.api import GenerateArgs, run_generate
from hpcodegen.hf import read_hf_config

pytestmark = pytest.mark.slow

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"


def meta_of(config: dict, tp: int = 2, sp: bool = False,
            notes: list[str] | None = None, build: Callable[..., dict] = build_bundle) -> dict:
    files = build(config, tp, sp, None, "t", notes=notes)
    return json.loads(files["codegen_meta.json"])


def family(name: str) -> dict:
    return read_hf_config(FAMILIES / name)[0]


def generate_cli(tmp_path: Path, config: dict, *extra: str) -> tuple[int, str, str]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(config))
    out, err = io.StringIO(), io.StringIO()
    as_json = "--json" in extra
    code = run_generate(GenerateArgs(model, 2, tmp_path / "out", as_json=as_json), out, err)
    return code, out.getvalue(), err.getvalue()


def test_composite_config_builds_the_text_model_with_every_layer_kind_split() -> None:
    """Qwen3.5's config.json is composite (text_config + vision_config); its causal LM takes
    the text part, as transformers' auto class builds it. Its hybrid layers (linear
    attention, then full attention) are both split."""
    config = family("qwen3_5")
    assert "vocab_size" not in config and config["text_config"]["layer_types"][-1] == \
        "full_attention"
    notes: list[str] = []
    plan = meta_of(config, notes=notes)["param_plan"]
    full = config["text_config"]["num_hidden_layers"] - 1
    assert plan[f"model.layers.{full}.self_attn"]["params"]["o_proj.weight"] == {"tp": "S(1)"}
    # HF gathers each linear-attention projection (colwise_gather_output)
    qkv = plan["model.layers.0.linear_attn.in_proj_qkv"]
    assert qkv["params"]["weight"] == {"tp": "S(0)"}
    assert qkv["out_src"] == {"output": {"tp": "S(-1)"}}
    assert plan["model.embed_tokens"]["params"]["weight"] == {"tp": "S(0)"}
    assert not [n for n in notes if "match no module" in n]


def test_hf_rules_matching_no_module_are_a_note_not_a_failure(tmp_path: Path) -> None:
    """All-linear-attention layers: HF's self_attn rules match nothing; transformers skips
    them, so does generate, naming them (text and --json)."""
    config = family("qwen3_5")
    text = config["text_config"]
    text["layer_types"] = ["linear_attention"] * text["num_hidden_layers"]
    code, out, err = generate_cli(tmp_path, config)
    assert code == 0, err
    assert "model.layers.*.self_attn.o_proj" in out and "skipped" in out
    plan = json.loads((tmp_path / "out" / "codegen_meta.json").read_text())["param_plan"]
    assert plan["model.layers.0.linear_attn.out_proj"]["params"]["weight"] == {"tp": "S(0)"}
    assert not any(".self_attn" in fqn for fqn in plan)
    code, out, _ = generate_cli(tmp_path, config, "--json")
    doc = json.loads(out)  # the notes build_bundle gave generate
    (note,) = [n for n in doc["notes"] if "match no module" in n]
    assert code == 0 and "model.layers.*.self_attn.q_proj" in note
    assert doc["package_rules"] == []


def test_a_class_taking_another_config_class_is_refused_precisely(tmp_path: Path) -> None:
    """MusicgenForCausalLM takes the decoder's config, not the composite MusicgenConfig:
    transformers cannot build it either. The refusal names both classes."""
    from transformers import MusicgenConfig

    config = MusicgenConfig().to_dict()
    config["architectures"] = ["MusicgenForCausalLM"]
    with pytest.raises(PlanError) as exc:
        meta_of(config)
    (finding,) = exc.value.findings
    assert finding.code == "config.class_mismatch"
    assert "MusicgenDecoderConfig" in finding.message and "MusicgenConfig" in finding.message
    assert "'decoder'" in (finding.hint or "")
    code, _, err = generate_cli(tmp_path, config)
    assert code == 1 and "Traceback" not in err and "internal error" not in err


def test_a_config_transformers_cannot_build_is_refused_with_its_reason(tmp_path: Path) -> None:
    """LFM2-MoE's default leaves layer_types unset and its __init__ indexes it: a clear
    refusal (exit 1) naming the class and transformers' error, never an internal error."""
    config = family("lfm2_moe")
    assert config.get("layer_types") is None
    code, _, err = generate_cli(tmp_path, config)
    assert code == 1, err
    assert "transformers cannot build Lfm2MoeForCausalLM from this config: TypeError" in \
        " ".join(err.split())
    assert "internal error" not in err and "Traceback" not in err


def test_hf_config_with_infinity_and_nan_reads(tmp_path: Path, llama_dir: Path) -> None:
    """transformers writes non-finite floats as Python's json does (Infinity, NaN): the HF
    config reads; the meta generate writes stays strict JSON."""
    text = (llama_dir / "config.json").read_text().rstrip().rstrip("}")
    text += ', "time_step_limit": [0.0, Infinity], "time_step_floor": NaN}'
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(text)
    config, _ = read_hf_config(model)
    assert config["time_step_limit"][1] == float("inf")
    out, err = io.StringIO(), io.StringIO()
    assert run_generate(GenerateArgs(model, 2, tmp_path / "out"), out, err) == 0, err.getvalue()

    def strict(constant: str) -> None:
        raise AssertionError(f"meta holds {constant}")

    json.loads((tmp_path / "out" / "codegen_meta.json").read_text(), parse_constant=strict)


def test_tied_parameters_get_the_sharded_placement(tmp_path: Path) -> None:
    """BERT ties the output bias to the prediction head's own bias (and the decoder weight
    to the word embeddings): every name of one tensor is planned the same, and verify
    passes it."""
    from hpcodegen.verify import run_verify

    config = family("bert")
    code, _, err = generate_cli(tmp_path, config)
    assert code == 0, err
    meta = json.loads((tmp_path / "out" / "codegen_meta.json").read_text())
    pairs = meta["tied_pairs"]
    assert ["cls.predictions.bias", "cls.predictions.decoder.bias"] in pairs
    plan = meta["param_plan"]
    assert plan["cls.predictions"]["params"]["bias"] == \
        plan["cls.predictions.decoder"]["params"]["bias"] == {"tp": "S(0)"}
    assert plan["bert.embeddings.word_embeddings"]["params"]["weight"] == {"tp": "S(0)"}
    out, err = io.StringIO(), io.StringIO()
    assert run_verify([tmp_path / "out"], hf_config=tmp_path / "model", stdout=out,
                      stderr=err) == 0, out.getvalue() + err.getvalue()


def test_tied_parameters_planned_two_sharded_ways_are_refused() -> None:
    import torch
    from torch import nn

    from hpcodegen.generate.layouts.tied import tied_pairs, unify_tied_placements

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(8, 4)
            self.head = nn.Linear(4, 8, bias=False)
            self.head.weight = self.emb.weight

    with torch.device("meta"):
        model = Tiny()
    assert tied_pairs(model) == [["emb.weight", "head.weight"]]
    from hpcodegen.plan.draft import DraftPlan, entries_to_json

    plan = {"emb": {"params": {"weight": {"tp": "S(0)"}}, "is_boundary": True},
            "head": {"params": {"weight": {"tp": "S(1)"}}, "is_boundary": True}}
    with pytest.raises(PlanError) as exc:
        unify_tied_placements(model, DraftPlan.from_json(plan))
    assert exc.value.findings[0].code == "generate.tied_placements"
    assert "different sharded placements" in exc.value.findings[0].message
    # a replicated alias a boundary computes with cannot take the shard either
    plan["head"]["params"]["weight"] = {"tp": "R"}
    with pytest.raises(PlanError, match="replicated inside the boundary head"):
        unify_tied_placements(model, DraftPlan.from_json(plan))
    # a parameter-only alias (no rule named it) takes the shard, its partial grad dropped
    plan["head"] = {"params": {"weight": {"tp": "R"}}, "is_boundary": False,
                    "partial_grad_params": ["weight"]}
    draft = DraftPlan.from_json(plan)
    assert unify_tied_placements(model, draft) == ["head.weight"]
    assert entries_to_json(draft.view())["head"] == {"params": {"weight": {"tp": "S(0)"}},
                                                     "is_boundary": False}


def test_local_params_style_on_an_attention_with_sinks() -> None:
    """Granite-SWA: ``self_attn: local_params`` and ``self_attn.sinks: colwise``: the
    attention region runs on local shards already; the per-head sinks are split with the
    heads."""
    params = meta_of(family("granite_swa"))["param_plan"]["model.layers.0.self_attn"]["params"]
    assert params["sinks"] == {"tp": "S(0)"} and params["q_proj.weight"] == {"tp": "S(0)"}
    assert params["o_proj.weight"] == {"tp": "S(1)"}


def test_local_params_outside_a_region_is_refused() -> None:
    from hpcodegen.generate.layouts.lift import lift_plan
    from hpcodegen.generate.sources.hf_plan import expand_rules
    from hpcodegen.hf import build_meta_model

    model = build_meta_model(family("bert"))
    fqns = list(dict(model.named_modules()))
    rules = [("bert.encoder.layer.*.attention.self", "local_params")]
    with pytest.raises(PlanError, match="no region runs its forward on local shards"):
        lift_plan(model, expand_rules(rules, fqns), False)


def test_mla_kv_a_proj_is_replicated_with_a_partial_gradient() -> None:
    """MiniCPM3 (MLA): kv_a_proj_with_mqa feeds the colwise kv_b_proj and the split heads'
    rope part directly; inside the attention region it is replicated and its gradient is
    partial over tp (synchronised), as HF's all-reduce of the rope part's gradient."""
    entry = meta_of(family("minicpm3"))["param_plan"]["model.layers.0.self_attn"]
    assert entry["params"]["kv_a_proj_with_mqa.weight"] == {"tp": "R"}
    assert entry["params"]["kv_b_proj.weight"] == {"tp": "S(0)"}
    assert "kv_a_proj_with_mqa.weight" in entry["partial_grad_params"]
    assert entry["out_src"] == {"output": {"tp": "P(sum)"}}


def test_a_tied_embedding_alias_becomes_a_vocab_parallel_boundary(tmp_path: Path) -> None:
    """ProphetNet's decoder wrapper holds the word embeddings twice (tied, one tensor):
    the alias takes the row shard, so it must also be a vocab-parallel boundary (masked
    lookup, partial output reduced), or verify refuses its lookup."""
    from hpcodegen.verify import run_verify

    config = family("prophetnet")
    code, _, err = generate_cli(tmp_path, config)
    assert code == 0, err
    plan = json.loads((tmp_path / "out" / "codegen_meta.json").read_text())["param_plan"]
    outer, inner = plan["prophetnet.word_embeddings"], plan["prophetnet.decoder.word_embeddings"]
    assert outer["params"] == inner["params"] == {"weight": {"tp": "S(0)"}}
    assert outer["out_src"] == inner["out_src"] == {"output": {"tp": "P(sum)"}}
    out, err2 = io.StringIO(), io.StringIO()
    assert run_verify([tmp_path / "out"], hf_config=tmp_path / "model", stdout=out,
                      stderr=err2) == 0, out.getvalue()


def test_output_heads_in_a_module_list_are_replicated_not_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """MusicGen's decoder has one LM head per codebook (a ModuleList): with no rule naming
    them (here: without musicgen.yaml), no boundary can be placed on the list, so its heads
    are planned replicated like any unnamed parameter."""
    import hpcodegen.generate.sources.plan_sources as sources

    monkeypatch.setattr(sources, "package_rules", lambda *a, **k: None)
    # the real build, not the shared one: what it answers under the patch is this test's
    plan = meta_of(family("musicgen"), build=api.build_bundle)["param_plan"]
    assert "lm_heads" not in plan or not plan["lm_heads"].get("is_boundary")
    heads = {f"{fqn}.{rel}": named for fqn, entry in plan.items() if fqn.startswith("lm_heads")
             for rel, named in entry["params"].items()}
    assert heads and all(named == {"tp": "R"} for named in heads.values())


def test_a_composite_config_is_planned_by_the_hf_plan_of_the_part_it_builds() -> None:
    """Llama 4's composite config (model_type llama4) builds Llama4ForCausalLM from its
    text part, whose decoder sits under ``model.`` while the class names its prefix
    ``language_model``: the text part's HF plan applies under ``model.``, no rule file."""
    config = family("llama4")
    assert config["model_type"] == "llama4" and config["text_config"]["model_type"] == \
        "llama4_text"
    notes: list[str] = []
    plan = meta_of(config, notes=notes)["param_plan"]
    assert not any("package rules" in n for n in notes), notes
    assert plan["model.layers.0.self_attn"]["params"]["o_proj.weight"] == {"tp": "S(1)"}
    experts = plan["model.layers.0.feed_forward"]["params"]
    assert experts["experts.gate_up_proj"] == {"tp": "SS(2,2)"}
    assert experts["experts.down_proj"] == {"tp": "S(1)"}


def test_rules_are_chosen_by_the_sub_config_the_model_is_built_from() -> None:
    from types import SimpleNamespace

    from hpcodegen.generate.sources.plan_sources import rules_scope

    text = {"model_type": "llama4_text", "hidden_size": 8}
    composite = {"model_type": "llama4", "text_config": text}
    built_from_text = SimpleNamespace(config=SimpleNamespace(model_type="llama4_text"))
    built_whole = SimpleNamespace(config=SimpleNamespace(model_type="llama4"))
    assert rules_scope(composite, built_from_text) is text
    assert rules_scope(composite, built_whole) is composite


def test_gemma3n_mlp_with_activation_sparsity_stays_replicated() -> None:
    """Gemma 3n's sparse MLP takes mean and std over the whole intermediate dim: split, each
    rank would use its slice's statistics. The package rules keep it replicated and split
    attention."""
    config = family("gemma3n_text")
    assert any(v > 0 for v in config["activation_sparsity_pattern"])
    notes: list[str] = []
    plan = meta_of(config, notes=notes)["param_plan"]
    assert any("rules/gemma3n_text.yaml" in n for n in notes)
    assert plan["model.layers.0.self_attn"]["params"]["q_proj.weight"] == {"tp": "S(0)"}
    mlp = {f"{fqn}.{rel}": named for fqn, entry in plan.items()
           if fqn.startswith("model.layers.0.mlp") for rel, named in entry["params"].items()}
    assert mlp and all(named == {"tp": "R"} for named in mlp.values())


def test_emu3_composite_config_is_seeded_from_its_text_decoder() -> None:
    """Emu3 ships no HF plan for its layers; its causal LM (built from the composite
    config's text part, model_type emu3_text_model) is split by the structural seeds."""
    notes: list[str] = []
    plan = meta_of(family("emu3"), notes=notes)["param_plan"]
    assert any(n.startswith("structural seeds:") for n in notes)
    assert plan["model.layers.0.self_attn"]["params"]["q_proj.weight"] == {"tp": "S(0)"}
    assert plan["model.layers.0.mlp"]["params"]["down_proj.weight"] == {"tp": "S(1)"}
