"""The gate proves what it passes (issue 34): hand-edited metas of generated artifacts that
install and train wrong, or cannot run, fail ``verify --strict --hf-config`` through the
derivation by propagation (:mod:`hpcodegen.derive`), each with a ``derive.*`` finding at
the JSON pointer of the declaration and the derived value; the unedited artifacts pass.

The artifacts are generated here from tiny configs of five plans (Qwen3 with sequence
parallelism, GPT-OSS with per-expert biases, Qwen3-MoE with experts over ep, Qwen3-MoE
with sequence parallelism, whose router runs on tokens flattened from a sequence shard, and
DeepSeek-V3's latent attention).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from gate_cases import cli_json as _cli

from hpcodegen.artifact.digest import meta_signature

pytestmark = pytest.mark.timeout(600)




FAMILIES = {
    "qwen3": ("qwen3", "Qwen3ForCausalLM", ["--tp", "2", "--sp"]),
    "gpt_oss": ("gpt_oss", "GptOssForCausalLM", ["--tp", "2"]),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", ["--tp", "2", "--ep", "2"]),
    "qwen3_moe_sp": ("qwen3_moe", "Qwen3MoeForCausalLM", ["--tp", "2", "--sp"]),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3ForCausalLM", ["--tp", "2"]),
}


@pytest.fixture(scope="module")
def generated(family_artifacts: Callable[[dict], dict[str, tuple[Path, Path]]]
              ) -> dict[str, tuple[Path, Path]]:
    """{family: (config dir, artifact dir)}, each built once per run (a family another
    module generated already is reused: ``conftest.family_artifacts``)."""
    return family_artifacts(FAMILIES)


def _edited(tmp: Path, src: Path, edit: Callable[[dict], None]) -> Path:
    art = tmp / src.name
    shutil.copytree(src, art)
    meta = json.loads((art / "codegen_meta.json").read_text())
    edit(meta)
    meta["signature"] = meta_signature(meta)
    (art / "codegen_meta.json").write_text(json.dumps(meta, indent=2))
    return art


def _findings(doc: dict) -> list[dict]:
    return [f for a in doc["artifacts"] for c in a["checks"].values() for f in c["findings"]]


def _plan(meta: dict) -> dict:
    return meta["param_plan"]


def _drop_q_norm(meta: dict) -> None:
    entry = _plan(meta)["model.layers.0.self_attn"]
    entry["partial_grad_params"] = [n for n in entry["partial_grad_params"]
                                    if n != "q_norm.weight"]


def _drop_sp_norm(meta: dict) -> None:
    _plan(meta)["model.layers.1.post_attention_layernorm"].pop("partial_grad_params")


def _drop_rank0(meta: dict) -> None:
    for entry in _plan(meta).values():
        entry.pop("tp_rank0_params", None)


def _drop_rank0_and_grads(meta: dict) -> None:
    for entry in _plan(meta).values():
        entry.pop("tp_rank0_params", None)
        entry.pop("partial_grad_params", None)


def _o_proj_rows(meta: dict) -> None:
    _plan(meta)["model.layers.0.self_attn"]["params"]["o_proj.weight"]["tp"] = "S(0)"


def _q_b_rows(meta: dict) -> None:
    """MLA's latent query up-projection split row-wise: its whole-width input (the
    replicated latent) then meets a weight of half the width on each rank."""
    _plan(meta)["model.layers.0.self_attn"]["params"]["q_b_proj.weight"]["tp"] = "S(1)"


def _no_dispatch(meta: dict) -> None:
    meta["injections"] = []


def _params_less_entry(meta: dict) -> None:
    _plan(meta)["model.layers.1"] = {"partial_grad_params": ["input_layernorm.weight"]}


HOSTILE = {
    "q_norm partial gradient dropped": (
        "qwen3", _drop_q_norm, "derive.partial_grad",
        "/param_plan/model.layers.0.self_attn/partial_grad_params"),
    "sp norm partial gradient dropped": (
        "qwen3", _drop_sp_norm, "derive.partial_grad",
        "/param_plan/model.layers.1.post_attention_layernorm/partial_grad_params"),
    "tp_rank0_params removed (per-expert biases)": (
        "gpt_oss", _drop_rank0, "derive.local_compute",
        "/param_plan/model.layers.0.mlp.experts"),
    "tp_rank0_params and partial gradients removed": (
        "gpt_oss", _drop_rank0_and_grads, "derive.local_compute",
        "/param_plan/model.layers.0.mlp.experts"),
    "output projection split S(0)": (
        "qwen3", _o_proj_rows, "derive.output",
        "/param_plan/model.layers.0.self_attn/out_src/output/tp"),
    "output projection split S(0) in an MoE under sp": (
        "qwen3_moe_sp", _o_proj_rows, "derive.output",
        "/param_plan/model.layers.0.self_attn/out_src/output/tp"),
    "a latent query projection split row-wise (MLA)": (
        "deepseek_v3", _q_b_rows, "derive.local_compute",
        "/param_plan/model.layers.0.self_attn"),
    "ep experts without the dispatch injection": (
        "qwen3_moe", _no_dispatch, "plan.ep_dispatch_mismatch",
        "/param_plan/model.layers.0.mlp.experts"),
    "a params-less entry naming another entry's parameter": (
        "qwen3", _params_less_entry, "plan.partial_grad_params_other_entry",
        "/param_plan/model.layers.1/partial_grad_params/0"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_meta_fails_the_gate(case, generated, tmp_path) -> None:
    family, edit, code, where = HOSTILE[case]
    cfg, src = generated[family]
    art = _edited(tmp_path, src, edit)
    exit_code, doc = _cli("verify", "--strict", "--hf-config", cfg, art)
    assert exit_code == 1, case
    hits = [f for f in _findings(doc) if f["code"] == code and f["severity"] == "error"]
    assert hits, (case, sorted({f["code"] for f in _findings(doc)}))
    assert any(f["path"] == where for f in hits), (case, [f["path"] for f in hits])


def test_o_proj_split_names_the_op_that_needs_a_collective(generated, tmp_path) -> None:
    cfg, src = generated["qwen3"]
    _, doc = _cli("verify", "--strict", "--hf-config", cfg, _edited(tmp_path, src,
                                                                     _o_proj_rows))
    local = [f for f in _findings(doc) if f["code"] == "derive.local_compute"]
    assert local and "aten.mm" in local[0]["message"], local
    out = [f for f in _findings(doc) if f["code"] == "derive.output"]
    assert out[0]["expected"] == "S(2)", out  # derived: the output is sharded, not partial


def test_q_norm_verdict_is_derived_not_matched(generated, tmp_path) -> None:
    """The rule check is switched off (--skip plan): the derivation alone refuses it."""
    cfg, src = generated["qwen3"]
    art = _edited(tmp_path, src, _drop_q_norm)
    code, doc = _cli("verify", "--strict", "--skip", "plan", "--hf-config", cfg, art)
    assert code == 1
    assert {f["code"] for f in _findings(doc)} >= {"derive.partial_grad"}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generated_artifacts_pass_with_every_boundary_derived(family, generated) -> None:
    cfg, art = generated[family]
    code, doc = _cli("verify", "--strict", "-v", "--hf-config", cfg, art)
    assert code == 0, [f for f in _findings(doc) if f["severity"] != "info"]
    summary = [f for f in _findings(doc) if f["code"] == "derive.summary"]
    assert summary and "derived by propagation at tp=2" in summary[0]["message"]
    # nothing left to the rules: the router's top-k on a sequence shard flattened into
    # tokens is derived row by row, as each rank's local code runs it
    assert not [f for f in _findings(doc) if f["code"] == "derive.rule_gap"]


def test_partial_over_a_tp_axis_of_one_rank_is_not_an_error(tmp_path) -> None:
    """The existing system's DeepSeek V4.1 meta runs tp 1, ep 8 and declares ``P(sum)``
    over tp: over one rank that moves nothing. The Qwen3-MoE bundle meta reshaped so."""
    root = Path(__file__).resolve().parents[1] / "fixtures" / "artifacts"
    art = tmp_path / "tp1"
    shutil.copytree(root / "qwen3_moe_g3", art)
    meta = json.loads((art / "codegen_meta.json").read_text())
    meta["parallel_dims"].update(tp_size=1, ep_size=8)
    for entry in meta["param_plan"].values():  # over one tp rank nothing is split
        for named in (entry.get("params") or {}).values():
            if "tp" in named:
                named["tp"] = "R"
    for record in meta.get("injections", []):
        if "ep_size" in record:
            record["ep_size"] = 8
    assert any(v.get("tp") == "P(sum)" for e in meta["param_plan"].values()
               for v in (e.get("out_src") or {}).values())
    (art / "codegen_meta.json").write_text(json.dumps(meta, indent=2))
    code, doc = _cli("verify", art)
    codes = {f["code"] for f in _findings(doc) if f["severity"] == "error"}
    assert "plan.partial_output_unsplit" not in codes, codes
    assert code == 0, codes


def test_a_cp_wrapper_the_install_refuses_fails_verify_first(tmp_path) -> None:
    """``causal: false`` on a causal attention: the ranks refuse it at install; verify
    refuses it first, by the install's own rule."""
    root = Path(__file__).resolve().parents[2] / "examples"

    def not_causal(meta: dict) -> None:
        meta["injections"][0]["inner_wrapper"]["causal"] = False

    art = _edited(tmp_path, root / "llama_cp2_tp2_sp", not_causal)
    code, doc = _cli("verify", "--strict", "--hf-config", root / "configs" / "llama", art)
    hits = [f for f in _findings(doc) if f["code"] == "model.wrapper_target_args"]
    assert code == 1 and hits, sorted({f["code"] for f in _findings(doc)})
    assert hits[0]["path"] == "/injections/0/inner_wrapper"
    assert "causal=False" in hits[0]["message"]
