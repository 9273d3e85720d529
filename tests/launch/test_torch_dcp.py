"""torch's own tools on a parallelized model, in user scripts run by ``hpcodegen launch``:
``torch.distributed.checkpoint.save(model.state_dict())`` at tp 2, ``load`` into a tp 4 model
(every parameter and AdamW state equal to the saved model's), and
``torch.nn.utils.clip_grad_norm_`` on the DTensor parameters giving hpcodegen's exact norm.

The tp 2 save is the second part of ``user_scripts.SCRIPT``, run by the real launch
``test_user_script.py`` shares (the session fixture ``user_script_run``: launching a user
script is that test's subject). The tp 4 load, whose subject is what DCP and the AdamW state
give at another world size, runs the same script a launched rank would run, with the
environment ``launch llama_tp4 --nproc 4 -- load.py`` gives each rank, on 4 of the
session's kept gloo ranks (``user_scripts.script_on_rank``): the larger world of the pair
without a launcher, a torchrun and four fresh interpreters importing torch.
"""

from __future__ import annotations

import pytest
from launch_gloo import rank_env
from launch_helpers import LLAMA_CONFIG, REPO
from user_scripts import script_on_rank

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
def test_dcp_of_model_state_dict_saved_at_tp2_loads_at_tp4(tmp_path, gloo, user_script_run):
    first = user_script_run.run
    assert first.code == 0, first.stdout + first.stderr
    load = tmp_path / "load.py"
    load.write_text(LOAD)
    tp4 = REPO / "examples" / "llama_tp4"
    job = rank_env(tp4, LLAMA_CONFIG, 4, script=(str(load),))
    printed = gloo(4, script_on_rank, job,
                   [str(load), str(user_script_run.dcp), str(user_script_run.full)])
    assert [p["stdout"].count("equal: 21 parameters, all DTensors") for p in printed] == \
        [1, 1, 1, 1], printed
