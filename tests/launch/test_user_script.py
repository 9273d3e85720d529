"""A user script under ``hpcodegen launch ARTIFACT -- train.py``: setup() gives the model."""

from __future__ import annotations

import pytest
from launch_helpers import EXAMPLE, LLAMA_CONFIG, run_cli

TRAIN = """
import sys, torch
import hpcodegen.launch

model, mesh_context = hpcodegen.launch.setup()
assert mesh_context.device_mesh.mesh_dim_names == ("dp", "tp")
ids = torch.randint(0, 256, (1, 8))
logits = model(input_ids=ids).logits
assert logits.shape == (1, 8, 256), logits.shape
q = model.model.layers[0].self_attn.q_proj.weight
assert q.shape == (32, 64), q.shape   # 64 output features split over tp=2
print("script args", sys.argv[1:], flush=True)
"""


@pytest.mark.gloo
@pytest.mark.timeout(150)
def test_setup_in_user_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--json", "--", script, "--lr", "3e-4", timeout=140)
    assert run.code == 0, run.stdout + run.stderr
    doc = run.json()
    assert [r["status"] for r in doc["ranks"]] == ["ok", "ok"]
    assert all(r["local_param_bytes"] > 0 for r in doc["ranks"])
    assert "script args ['--lr', '3e-4']" in run.stderr + run.stdout
