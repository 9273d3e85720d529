"""torch's own tools on a parallelized model, in user scripts run by ``hpcodegen launch``:
``torch.distributed.checkpoint.save(model.state_dict())`` at tp 2, ``load`` into a tp 4 model
(every parameter and AdamW state equal to the saved model's), and
``torch.nn.utils.clip_grad_norm_`` on the DTensor parameters giving hpcodegen's exact norm."""

from __future__ import annotations

import pytest
from launch_helpers import LLAMA_CONFIG, REPO, run_cli

SAVE = """
import sys, torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict)
from torch.distributed.tensor import DTensor
import hpcodegen.launch
from hpcodegen.checkpoint.clip import total_grad_norm

run = hpcodegen.launch.setup()
model = run.model
optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(3))
model(input_ids=ids).logits.pow(2).mean().backward()
exact = float(total_grad_norm(model))
norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # it scales
norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
assert exact > 0.05 and abs(norm - exact) <= 1e-5 * exact, (norm, exact)
optim.step()                         # the saved weights are not the seeded init any more
state = model.state_dict()
assert isinstance(state["model.layers.0.self_attn.q_proj.weight"], DTensor)
dcp.save({"model": state, "optim": get_optimizer_state_dict(model, optim)},
         checkpoint_id=sys.argv[1])
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
osd = get_optimizer_state_dict(model, optim, options=StateDictOptions(full_state_dict=True))
if torch.distributed.get_rank() == 0:
    torch.save({"model": full, "optim": osd["state"]}, sys.argv[2])
"""

LOAD = """
import sys, torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.tensor import DTensor
import hpcodegen.launch

run = hpcodegen.launch.setup(seed=11)   # another init: everything below comes from the file
model = run.model
assert run.mesh_context.device_mesh.size() == 4
optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
state = {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, optim)}
dcp.load(state, checkpoint_id=sys.argv[1])
model.load_state_dict(state["model"])
set_optimizer_state_dict(model, optim, state["optim"])
want = torch.load(sys.argv[2], weights_only=False)
checked = 0
for name, value in model.state_dict().items():
    whole = value.full_tensor() if isinstance(value, DTensor) else value
    assert torch.equal(whole, want["model"][name]), name
    checked += isinstance(value, DTensor)   # every planned parameter
q = model.model.layers[0].self_attn.q_proj.weight       # S(0) over tp=4: 16 of 64 rows
rank = torch.distributed.get_rank()
assert torch.equal(q.to_local(),
                   want["model"]["model.layers.0.self_attn.q_proj.weight"][16 * rank:][:16])
for name, entry in get_optimizer_state_dict(model, optim)["state"].items():
    got = entry["exp_avg"]
    got = got.full_tensor() if isinstance(got, DTensor) else got
    assert torch.equal(got, want["optim"][name]["exp_avg"]), name
print(f"equal: {checked} parameters, all DTensors", flush=True)
"""


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_dcp_of_model_state_dict_saved_at_tp2_loads_at_tp4(tmp_path):
    save, load = tmp_path / "save.py", tmp_path / "load.py"
    save.write_text(SAVE)
    load.write_text(LOAD)
    ckpt, full = tmp_path / "ckpt", tmp_path / "full.pt"
    common = ("--device", "cpu", "--model-dir", LLAMA_CONFIG)
    first = run_cli(REPO / "examples" / "llama_tp2", "--nproc", "2", *common, "--",
                    save, ckpt, full, timeout=300)
    assert first.code == 0, first.stdout + first.stderr
    second = run_cli(REPO / "examples" / "llama_tp4", "--nproc", "4", *common, "--",
                     load, ckpt, full, timeout=300)
    assert second.code == 0, second.stdout + second.stderr
    assert (second.stdout + second.stderr).count("equal: 21 parameters, all DTensors") == 4
