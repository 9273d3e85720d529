"""What the user-script launches of ``test_user_script.py`` and ``test_torch_dcp.py``
share: one real ``launch EXAMPLE --nproc 2 --model-dir DIR -- script`` at tp 2 runs both
files' tp 2 parts in one script (setup() from safetensors, clipping, save and resume; then
torch's own DCP of ``model.state_dict()`` and the AdamW state), instead of a launch each.

Imported by module name (tests/ directories are not packages); the run itself is the
session fixture ``user_script_run`` (tests/launch/conftest.py). :func:`script_on_rank` runs a
user script as a launched rank runs it, on the session's kept gloo ranks (the tp 4 load of
``test_torch_dcp.py``: the larger world of the save -> load pair, whose real launch is the
tp 2 one here).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch_helpers import EXAMPLE, LLAMA_CONFIG, CliRun, check_in_process, run_cli

#: argv: SAFETENSORS CKPT DCP_DIR FULL_PT [script args...]; the first part is
#: test_user_script.py's, the second (after "torch's own tools") test_torch_dcp.py's
SCRIPT = """
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
print("script args", sys.argv[5:], flush=True)

# torch's own tools (test_torch_dcp.py): continues the script above, on its model
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict)
from torch.distributed.tensor import DTensor
from hpcodegen.checkpoint.clip import total_grad_norm

model.zero_grad()                    # the gradients of this part only
optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(3))
# a sum, not a mean: the pretrained weights' logits are small, and 0.05 must clip
model(input_ids=ids).logits.pow(2).sum().backward()
exact = float(total_grad_norm(model))
norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # it scales
norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
assert exact > 0.05 and abs(norm - exact) <= 1e-5 * exact, (norm, exact)
optim.step()                         # the saved weights are this part's own step
state = model.state_dict()
assert isinstance(state["model.layers.0.self_attn.q_proj.weight"], DTensor)
dcp.save({"model": state, "optim": get_optimizer_state_dict(model, optim)},
         checkpoint_id=sys.argv[3])
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
osd = get_optimizer_state_dict(model, optim, options=StateDictOptions(full_state_dict=True))
if torch.distributed.get_rank() == 0:
    torch.save({"model": full, "optim": osd["state"]}, sys.argv[4])
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


@dataclass
class UserScriptRun:
    """The launch and the files its script wrote."""

    run: CliRun
    dcp: Path  #: torch's DCP of model.state_dict() and the AdamW state, at tp 2
    full: Path  #: the same state, whole (rank 0's torch.save), to compare with


def launch_user_script(tmp: Path) -> UserScriptRun:
    """The tp 2 launch of :data:`SCRIPT` with a safetensors model dir, in ``tmp``."""
    from safetensors.torch import save_file

    model_dir = tmp / "llama"
    shutil.copytree(LLAMA_CONFIG, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    save_file(_llama_state(config), str(model_dir / "model.safetensors"))
    # launch's pre-start model check in this process (its verdict cached), not in a child
    check_in_process(EXAMPLE, model_dir)
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    dcp, full = tmp / "dcp", tmp / "full.pt"
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", model_dir,
                  "--json", "--", script, model_dir / "model.safetensors", tmp / "ckpt",
                  dcp, full, "--lr", "3e-4", timeout=300)
    return UserScriptRun(run, dcp, full)


def script_on_rank(job_env: dict[str, str], argv: list[str]) -> dict[str, Any]:
    """``argv`` (a user script and its arguments) run as a launched rank runs it
    (:mod:`hpcodegen.launch.rank.worker`: ``__main__``, its own ``sys.argv``, the
    launcher's ``HPCODEGEN_*`` environment ``job_env`` and torchrun's rank variables) on
    this kept gloo rank; returns what the script printed. A script that raises fails the
    gloo call naming the rank, with its traceback (the world is then ended, as a failed
    launch ends its ranks). Not the worker's ``run_rank`` itself: it ends the process group,
    which the kept ranks keep for the next job."""
    import contextlib
    import io
    import os
    import runpy
    import sys

    import torch.distributed as dist

    from hpcodegen.launch import env

    rank, world = dist.get_rank(), dist.get_world_size()
    before, argv_before = dict(os.environ), sys.argv
    for key in env.ALL:
        os.environ.pop(key, None)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), **job_env})
    out = io.StringIO()
    try:
        sys.argv = [str(a) for a in argv]
        with contextlib.redirect_stdout(out):
            runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        sys.argv = argv_before
        os.environ.clear()
        os.environ.update(before)
    dist.barrier()
    return {"stdout": out.getvalue()}
