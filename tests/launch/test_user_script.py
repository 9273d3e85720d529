"""A user script under ``hpcodegen launch ARTIFACT -- train.py``: setup() gives the model,
sharded from the safetensors weights found in ``--model-dir``, and what the script needs to
clip by the global norm, save and resume."""

from __future__ import annotations

import json
import shutil

import pytest
from launch_helpers import EXAMPLE, LLAMA_CONFIG, run_cli

TRAIN = """
import sys, torch
from safetensors.torch import load_file
import hpcodegen.launch

run = hpcodegen.launch.setup()
model, mesh_context = run
rank = torch.distributed.get_rank()
assert mesh_context.device_mesh.mesh_dim_names == ("dp", "tp")
saved = load_file(sys.argv[1])
q = model.model.layers[0].self_attn.q_proj.weight.to_local()  # S(0) over tp=2: 32 of 64 rows
assert torch.equal(q, saved["model.layers.0.self_attn.q_proj.weight"][32 * rank: 32 * rank + 32])
down = model.model.layers[1].mlp.down_proj.weight.to_local()  # S(1): 64 of 128 columns
assert torch.equal(down, saved["model.layers.1.mlp.down_proj.weight"][:, 64 * rank: 64 * rank + 64])
assert torch.equal(model.model.norm.weight.full_tensor(), saved["model.norm.weight"])  # replicated
logits = model(input_ids=torch.randint(0, 256, (1, 8))).logits
assert logits.shape == (1, 8, 256), logits.shape

# clip_grad_norm_ by the global norm == torch's on the unsharded model
from transformers import AutoModelForCausalLM
ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
full = AutoModelForCausalLM.from_pretrained(sys.argv[1].rsplit("/", 1)[0])
full(input_ids=ids).logits.pow(2).mean().backward()
want = torch.nn.utils.clip_grad_norm_(full.parameters(), 1e9)
optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(input_ids=ids).logits.pow(2).mean().backward()
got = run.clip_grad_norm_(1e-3)
assert abs(float(got) - float(want)) <= 1e-5 * float(want), (float(got), float(want))
optim.step()
# save, spoil, resume: the shards and the optimizer state come back
before = {n: p.detach().clone() for n, p in model.named_parameters()}
run.save(sys.argv[2], optim, step=7)
with torch.no_grad():
    for p in model.parameters():
        p.zero_()
fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
assert run.resume(sys.argv[2], fresh) == 7
local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731 (DTensors)
assert all(torch.equal(local(p), local(before[n])) for n, p in model.named_parameters())
a, b = optim.state_dict()["state"], fresh.state_dict()["state"]
assert all(torch.equal(local(a[i]["exp_avg"]), local(b[i]["exp_avg"])) for i in a)
print("script args", sys.argv[3:], flush=True)
"""


def _llama_state(config: dict) -> dict:
    """A full llama state dict for ``config`` (random values; names as transformers saves)."""
    import torch

    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    q = config["num_attention_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
              "lm_head.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                   p + "mlp.down_proj.weight": (h, i), p + "input_layernorm.weight": (h,),
                   p + "post_attention_layernorm.weight": (h,)}
    gen = torch.Generator().manual_seed(7)
    return {name: torch.randn(shape, generator=gen) * 0.02 for name, shape in shapes.items()}


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_setup_in_user_script_loads_safetensors(tmp_path):
    from safetensors.torch import save_file

    model_dir = tmp_path / "llama"
    shutil.copytree(LLAMA_CONFIG, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    save_file(_llama_state(config), str(model_dir / "model.safetensors"))
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", model_dir,
                  "--json", "--", script, model_dir / "model.safetensors", tmp_path / "ckpt",
                  "--lr", "3e-4",
                  timeout=300)
    assert run.code == 0, run.stdout + run.stderr
    doc = run.json()
    assert [r["status"] for r in doc["ranks"]] == ["ok", "ok"]
    assert all(r["weights"] == "1 safetensors file(s)" for r in doc["ranks"])
    assert all(r["local_param_bytes"] > 0 for r in doc["ranks"])
    assert "script args ['--lr', '3e-4']" in run.stderr
