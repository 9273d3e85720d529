"""Megatron layouts against the unsharded model on 2 gloo ranks (logits, every gradient,
AdamW losses), one case per rule: DeepSeek-V3's MLA split without HF rules (--sp), Phi-3's
fused q|k|v and gate|up split per block, OLMo-2's heads split with its whole-width q/k
norms summing their squares over tp, Phi-3.5-MoE's unplanned attention, Llama-4's
unrouted experts reduced with their block, Gemma-3's vision tower (with images); and
inspect-plan's counts equal CommDebugMode's for the split norms.

The artifacts come from the suite's memo (:mod:`artifact_memo`), labelled by model type as
tests/generate/test_layouts.py labels its plans of the same configs (DeepSeek-V3 and OLMo-2
with --sp, Llama-4): one build per run serves both modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "moe"))

from artifact_memo import write_artifact  # one build per distinct arguments and run

from hpcodegen.hf import read_hf_config

pytestmark = [pytest.mark.gloo, pytest.mark.slow]
FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
TOL = 1e-5


def _model(root: Path, name: str, config: dict) -> Path:
    model = root / "models" / name
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(config))
    return model


#: one case per rule (GLM-4's fused gate|up is Phi-3's rule; Qwen2-MoE's unplanned shared
#: expert runs in tests/moe/test_moe_sp.py)
CASES = (("deepseek_v3", True), ("phi3_mha", True), ("olmo2", True), ("phimoe", True),
         ("llama4_text", False))
#: Phi-3.5-MoE's shape, tiny: its HF plan names the experts only (attention split here)
PHIMOE = {"architectures": ["PhimoeForCausalLM"], "model_type": "phimoe", "hidden_size": 64,
          "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
          "vocab_size": 256, "max_position_embeddings": 128, "attention_bias": True,
          "tie_word_embeddings": False}


def _config(name: str) -> dict:
    from moe_configs import config_of

    if name in ("deepseek_v3", "qwen2_moe", "llama4_text"):
        return config_of(name)  # Qwen2-MoE's shared expert, Llama-4's unrouted experts
    if name == "phimoe":
        return dict(PHIMOE)
    config, _ = read_hf_config(FAMILIES / name.split("_")[0])
    if name == "phi3_mha":  # as many key/value heads as query heads: q|k|v splits per block
        config["num_key_value_heads"] = config["num_attention_heads"]
    return config


def _artifact(root: Path, name: str, sp: bool) -> tuple[str, str]:
    model = root / "models" / name
    if not model.exists():
        _model(root, name, _config(name))
    out = root / f"{name}_sp{int(sp)}"
    if not out.exists():  # labelled as tests/generate/test_layouts.py's plans: shared builds
        config = json.loads((model / "config.json").read_text())
        write_artifact(out, config, 2, sp, config["model_type"])
    return str(out), str(model)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One root for the module's artifacts: :func:`_artifact` writes each once (OLMo-2's
    is counted by one test and checked on gloo ranks by the next)."""
    return tmp_path_factory.mktemp("layouts")


@pytest.mark.timeout(400)
@pytest.mark.filterwarnings("ignore:.*backward hook:UserWarning")
def test_layout_counts_match_prediction(shared: Path, fake_world) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.hf import load_transformers_config
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.plan.predict import predict_plan, summarize
    from hpcodegen.runtime import parallelize_from_generated
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module

    arts = [_artifact(shared, "olmo2", True)]
    fake_world(2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    for out, model_dir in arts:
        meta = json.loads(Path(out, "codegen_meta.json").read_text())
        config = json.loads(Path(model_dir, "config.json").read_text())
        model = generated_model_class(plan_from_meta(meta), import_generated_module(Path(out)))(
            load_transformers_config(config)).float()
        parallelize_from_generated(model, mesh, out, hf_config=config)
        with CommDebugMode() as fwd:
            logits = model(input_ids=torch.randint(0, config["vocab_size"], (2, 8))).logits
        with CommDebugMode() as bwd:
            logits.float().pow(2).mean().backward()
        summary = summarize(predict_plan(plan_from_meta(meta)))
        for mode, tables in ((fwd, (summary.per_forward,)),
                             (bwd, (summary.per_backward, summary.grad_sync))):
            want = sum(n for t in tables for n in t.values())
            assert sum(mode.get_comm_counts().values()) == want, (out, tables)
        norms = sum(1 for f in meta["param_plan"] if f.endswith(("q_norm", "k_norm")))
        assert summary.per_forward[("all_reduce", "tp", None)] >= norms == 4


@pytest.mark.timeout(400)
def test_layouts_match_unsharded(shared: Path, gloo) -> None:
    from moe_workers import parity_cases

    cases = [(f"{name} sp={sp}", *_artifact(shared, name, sp), 2) for name, sp in CASES]
    for rank in gloo(2, parity_cases, cases):
        for name, r in rank.items():
            assert not r["odd"], (name, r["odd"])
            assert r["logits"] <= TOL and r["grad"] <= TOL, (name, r)
            assert r["loss_diff"] <= TOL, (name, r)


@pytest.mark.timeout(400)
def test_vision_tower_split_matches_unsharded_with_images(tmp_path: Path, gloo) -> None:
    """Gemma-3's composite: transformers plans the text model only; the SigLIP vision
    tower's attention and MLPs are split like any (Megatron layout), exact with images."""
    from layout_workers import image_case

    config = {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"model_type": "gemma3_text", "hidden_size": 64,
                        "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                        "vocab_size": 300, "query_pre_attn_scalar": 16, "sliding_window": 8},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32,
                          "intermediate_size": 64, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "image_size": 28, "patch_size": 7},
        "mm_tokens_per_image": 4, "image_token_index": 290, "boi_token_index": 291,
        "eoi_token_index": 292}
    model = _model(tmp_path, "gemma3", config)
    out = write_artifact(tmp_path / "gemma3_tp2", config, 2, False, "gemma3")
    meta = json.loads((out / "codegen_meta.json").read_text())
    attn = meta["param_plan"]["model.vision_tower.encoder.layers.0.self_attn"]
    assert attn["params"]["q_proj.weight"] == {"tp": "S(0)"}
    for r in gloo(2, image_case, str(out), str(model)):
        assert not r["odd"] and r["vision_grads"] > 0, r
        assert r["logits"] <= TOL and r["grad"] <= TOL, r
