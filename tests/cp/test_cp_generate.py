"""``generate --cp``: the plan it freezes, the layout, and what it refuses with the reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cp_paths import CONFIGS, REPO

sys.path.insert(0, str(REPO / "tests" / "cli"))
import inproc  # the CLI's own main in this process (tests/cli/inproc.py)

from hpcodegen.errors import PlanError, UsageError

FAMILIES = REPO / "tests" / "fixtures" / "families"


def _meta(artifact: Path) -> dict:
    return json.loads((artifact / "codegen_meta.json").read_text())


def _bundle(config_dir: Path, **kwargs) -> dict:
    from artifact_memo import build_bundle  # one build per distinct arguments and run

    from hpcodegen.hf import read_hf_config

    config, _ = read_hf_config(config_dir)
    rendered = build_bundle(config, kwargs.pop("tp", 1), kwargs.pop("sp", False), None,
                            config_dir.name, **kwargs)
    return json.loads(rendered["codegen_meta.json"])


def test_the_frozen_plan_keeps_the_existing_systems_conventions(cp_artifact) -> None:
    meta = _meta(cp_artifact("llama_gqa", tp=2, cp=2, sp=True))
    assert meta["mesh_dim_names"] == ["cp", "tp"]
    assert meta["parallel_dims"]["cp_size"] == 2
    assert meta["parallel_dims"]["cp_layout"] == "headtail"  # causal: balanced by default
    for fqn, entry in meta["param_plan"].items():
        assert all(named["cp"] == "R" for named in entry.get("params", {}).values()), fqn
        for side in ("in_src", "in_dst", "out_src", "out_dst"):
            for name, named in (entry.get(side) or {}).items():
                assert named["cp"] == "S(1)", (fqn, side, name)
    (record,) = meta["injections"]
    assert record["match"] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert record["inner_wrapper"] == {"_target_": "sdpa_hf", "causal": True}
    assert record["inner_in_src"] == {"key": {"cp": "S(2)"}, "value": {"cp": "S(2)"}}
    assert record["inner_in_dst"] == {"key": {"cp": "R"}, "value": {"cp": "R"}}


def test_softcapping_runs_the_models_eager_kernel_and_layouts_are_frozen(cp_artifact) -> None:
    meta = _meta(cp_artifact("gemma2_softcap", tp=1, cp=2, layout="contiguous"))
    assert meta["parallel_dims"]["cp_layout"] == "contiguous"
    assert {r["inner_wrapper"]["_target_"] for r in meta["injections"]} == {"eager_hf"}
    assert [fqn for r in meta["injections"] for fqn in r["match"]] == [
        "model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert meta["mesh_dim_names"] == ["cp", "tp"] and meta["parallel_dims"]["tp_size"] == 1


@pytest.mark.slow
def test_experts_take_their_flattened_tokens_cut_on_dim_0() -> None:
    meta = _bundle(REPO / "tests" / "fixtures" / "configs" / "qwen3_moe", tp=2, cp=2)
    experts = meta["param_plan"]["model.layers.0.mlp.experts"]
    assert {n["cp"] for side in ("in_src", "out_src") for n in experts[side].values()} == \
        {"S(0)"}
    assert all(n["cp"] == "R" for n in experts["params"].values())


@pytest.mark.parametrize("family,code,needle", [
    ("bloom", "generate.cp_token_mixer", "self_attention"),   # ALiBi: attention of its own
    ("lfm2", "generate.cp_token_mixer", "convolution"),       # short convolutions
    ("llama4", "generate.cp_chunked_attention", "chunked attention"),
])
def test_what_cannot_be_made_exact_is_refused_with_the_reason(family, code, needle) -> None:
    with pytest.raises(PlanError) as caught:
        _bundle(FAMILIES / family, cp=2)
    (finding,) = caught.value.findings
    assert finding.code == code and needle in finding.render(), finding.render()


def test_bad_options_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="--cp must be >= 1"):
        _bundle(CONFIGS / "llama_gqa", cp=0)
    with pytest.raises(UsageError, match="unknown layout 'zigzag'"):
        _bundle(CONFIGS / "llama_gqa", cp=2, cp_layout="zigzag")


def test_cli_generates_verifies_and_inspects(tmp_path) -> None:
    import io

    from hpcodegen.inspect.options import InspectOptions
    from hpcodegen.inspect.run import run_inspect
    from hpcodegen.verify import run_verify

    out = tmp_path / "art"
    run = inproc.run("generate", "--model",
                     str(CONFIGS / "mistral_swa"), "--tp", "2", "--cp", "2",
                     "--cp-layout", "contiguous", "-o", out)
    assert run.returncode == 0, run.stderr
    assert _meta(out)["parallel_dims"]["cp_layout"] == "contiguous"
    assert run_verify([out], hf_config=CONFIGS / "mistral_swa", stdout=io.StringIO()) == 0
    text = io.StringIO()
    code = run_inspect(InspectOptions(path=str(out), hf_config=str(CONFIGS / "mistral_swa"),
                                      batch=2, seq=64, dtype="fp32", as_json=True),
                       out=text, err=io.StringIO())
    assert code == 0
    volume = json.loads(text.getvalue())["volume"]
    kv = [c for c in volume["by_collective"] if c["axis"] == "cp" and c["dim"] == 2]
    # 2 layers x (K, V): [2 batch, 2 kv heads / tp 2, 64 seq, 16 head_dim] fp32, ring 1/2
    per_op = 0.5 * 2 * 1 * 64 * 16 * 4
    assert {(c["direction"], c["kind"], c["count"], c["bytes"]) for c in kv} == {
        ("forward", "all_gather", 4, 4 * per_op), ("backward", "reduce_scatter", 4, 4 * per_op)}
