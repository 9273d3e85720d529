"""The user's own loop under plain ``torchrun`` (issue 32's must-show): no hpcodegen
launcher, the user's own ``init_device_mesh("cpu", (2, 2), ("dp", "tp"))`` and
``Artifact.load(art).from_pretrained(hf_dir, mesh=mesh)`` on a tiny llama that
``save_pretrained`` wrote. The script run is examples/own_loop/train.py itself.

Two runs of it on a dp2 x tp2 mesh, each leg's promise checked once: FSDP2 over dp trains
two steps from the pretrained weights and saves (DCP), a plain 4-rank torchrun of the file;
a fresh run without FSDP2 resumes from that save (resharded from FSDP2's dp x tp shards onto
tp alone), trains two more steps averaging the gradients over dp, and saves again. The
resumed run is the same file run as ``__main__`` in 4 other processes, the session's kept
gloo ranks (``user_scripts.script_on_rank``; the script trains on a process group its caller
started): none of them saved, so what they hold comes from the checkpoint's files, without a
second torchrun and four fresh interpreters importing torch. Measured against transformers'
unsharded model: the pretrained logits, and every step's loss and global gradient norm, the
resumed run's from the unsharded model holding the first run's checkpoint; each checkpoint,
loaded into the unsharded model in this process, gives its run's trained logits. Parameters
are DTensors, so ``torch.nn.utils.clip_grad_norm_`` (what the script calls) sees the whole
model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "own_loop" / "train.py"
ARTIFACT = REPO / "examples" / "llama_tp2"
CONFIG = REPO / "examples" / "configs" / "llama"
#: a hard bound per torchrun job (4 gloo ranks on a loaded 2-core machine)
TIMEOUT = 420
#: the module's runs (a torchrun, then the resumed run on gloo ranks) plus the references,
#: for each test that may start them
RUNS_TIMEOUT = 2 * TIMEOUT + 120


def _script_module():
    """examples/own_loop/train.py as a module (its batch rule), without running main().
    Compiled from its bytes: a file loader would leave ``__pycache__`` in the shipped example
    where bytecode is written (``make test`` writes it)."""
    spec = importlib.util.spec_from_file_location("own_loop_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    exec(compile(SCRIPT.read_bytes(), str(SCRIPT), "exec"), module.__dict__)
    return module


def _torchrun(name: str, *args: str | Path) -> None:
    """One plain 4-rank torchrun of the script; a failure names the run ``name``."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "4", str(SCRIPT),
           *map(str, args)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO,
                              env=env, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{name}: torchrun ran past {TIMEOUT} s: {exc.stderr}") from None
    assert done.returncode == 0, f"{name}: " + done.stdout[-4000:] + done.stderr[-4000:]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A tiny random llama saved as transformers saves it (config.json + safetensors)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(CONFIG)).save_pretrained(out)
    assert list(out.glob("*.safetensors"))
    return out


def _on_gloo_ranks(gloo, name: str, *args: str | Path) -> None:
    """The script run as ``__main__`` with ``args`` on 4 of the session's kept gloo ranks
    (:func:`user_scripts.script_on_rank`), on their process group; a failure names the run
    ``name`` and carries the failing rank's traceback."""
    from user_scripts import script_on_rank

    try:
        gloo(4, script_on_rank, {}, [str(SCRIPT), *map(str, args)])
    except RuntimeError as exc:
        raise AssertionError(f"{name}: {exc}") from None


@pytest.fixture(scope="module")
def runs(hf_dir, tmp_path_factory, gloo) -> dict:
    """The script's two runs, one after the other: ``fsdp`` (a plain torchrun: FSDP2 over
    dp, two steps from the pretrained weights, then a DCP save) and ``resumed`` (a fresh run
    without FSDP2 in 4 processes that did not save: ``--resume`` from that save, two more
    steps, a save of its own)."""
    import torch

    tmp = tmp_path_factory.mktemp("own_loop")
    _torchrun("fsdp", ARTIFACT, hf_dir, "--fsdp", "--steps", "2",
              "--checkpoint", tmp / "fsdp_ckpt", "--report", tmp / "fsdp.json")
    _on_gloo_ranks(gloo, "resumed", ARTIFACT, hf_dir, "--steps", "2", "--resume",
                   tmp / "fsdp_ckpt", "--checkpoint", tmp / "ckpt", "--report",
                   tmp / "resumed.json")
    out = {}
    for name, ckpt in (("fsdp", "fsdp_ckpt"), ("resumed", "ckpt")):
        report = json.loads((tmp / f"{name}.json").read_text())
        report["tensors"] = torch.load(report["logits"])
        report["checkpoint"] = tmp / ckpt
        out[name] = report
    return out


@pytest.fixture(scope="module")
def ref(hf_dir, runs) -> dict:
    """transformers' unsharded references, once for the module's tests: ``pretrained``
    (the model ``hf_dir`` holds) and ``resumed`` (that model holding the fsdp run's
    checkpoint) each do what the script does (:func:`_reference`); ``saved`` is the
    eval logits of that model holding the resumed run's checkpoint."""
    return {"pretrained": _reference(_unsharded(hf_dir)),
            "resumed": _reference(_unsharded(hf_dir, runs["fsdp"]["checkpoint"])),
            "saved": _eval_logits(_unsharded(hf_dir, runs["resumed"]["checkpoint"]))}


def _unsharded(hf_dir: Path, checkpoint: Path | None = None):
    """transformers' model from ``hf_dir``; with ``checkpoint``, its weights replaced by
    that DCP checkpoint's, read whole in this one process (no process group)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    if checkpoint is not None:
        state = model.state_dict()
        with warnings.catch_warnings():  # DCP warns that it reads in one process, as asked
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(state, checkpoint_id=checkpoint, no_dist=True)
        model.load_state_dict(state)
    return model


def _eval_logits(model):
    """The script's evaluation: the logits of its seed-0 batch of 2 rows."""
    import torch

    model.eval()
    ids, _ = _script_module().batch(model.config.vocab_size, 2, 16, seed=0)
    with torch.no_grad():
        return model(input_ids=ids).logits


def _reference(model, steps: int = 2) -> dict:
    """``model`` doing what the script does on the whole global batch (dp=2 x 2 rows): its
    eval logits, then per step the loss and the global gradient norm (a fresh AdamW, lr
    1e-3, clipped at 1.0, the script's defaults)."""
    import torch

    script = _script_module()
    vocab = model.config.vocab_size
    logits = _eval_logits(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, norms = [], []
    for step in range(steps):
        ids, labels = script.batch(vocab, 4, 16, seed=100 + step)
        loss = torch.nn.functional.cross_entropy(
            model(input_ids=ids).logits.reshape(-1, vocab), labels.reshape(-1))
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        losses.append(float(loss.detach()))
        optimizer.step()
        optimizer.zero_grad()
    return {"logits": logits, "losses": losses, "norms": norms}


def _close(got: list[float], want: list[float], rel: float = 1e-5) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= rel * abs(w)
                                         for g, w in zip(got, want, strict=True))


@pytest.mark.timeout(RUNS_TIMEOUT)
def test_own_loop_from_pretrained_matches_transformers_and_resumes(runs, ref) -> None:
    """The pretrained weights on the user's dp2 x tp2 mesh give transformers' logits; the
    loop without FSDP2, resumed in a fresh run, gives the unsharded model's loss and norm
    at every step; its DCP save restores its trained model (in transformers' model)."""
    import torch

    fsdp, resumed = runs["fsdp"], runs["resumed"]
    assert fsdp["mesh"] == resumed["mesh"] == {"dp": 2, "tp": 2}
    assert fsdp["world"] == resumed["world"] == 4
    first = fsdp["tensors"]["first"]
    # the pretrained weights, sharded over tp by each rank's own reads: transformers' logits
    want = ref["pretrained"]["logits"]
    assert first.shape == want.shape
    assert torch.allclose(first, want, atol=1e-5, rtol=0)
    # the resumed run started from the checkpoint's model, as the unsharded reference did
    assert torch.allclose(resumed["tensors"]["first"], ref["resumed"]["logits"], atol=1e-5,
                          rtol=0)
    # every step: the loss over the global batch and the unsharded global grad norm
    want = ref["resumed"]
    assert _close(resumed["losses"], want["losses"]), (resumed["losses"], want["losses"])
    assert _close(resumed["grad_norms"], want["norms"]), (resumed["grad_norms"],
                                                          want["norms"])
    # it resumed a trained model (the first run's batches again, each at a lower loss than
    # there), training moved it, and its DCP save brings the trained model back
    assert all(r < f for r, f in zip(resumed["losses"], fsdp["losses"], strict=True)), (
        resumed["losses"], fsdp["losses"])
    last = resumed["tensors"]["last"]
    assert (last - resumed["tensors"]["first"]).abs().max() > 1e-3
    assert torch.allclose(ref["saved"], last, atol=1e-5, rtol=0)


def _frozen_sharded() -> list[str]:
    return json.loads((ARTIFACT / "codegen_meta.json").read_text())["frozen_sharded_params"]


@pytest.mark.timeout(RUNS_TIMEOUT)
def test_own_loop_dtensor_parameters_and_torch_clip(runs, ref) -> None:
    """Sharded parameters are DTensors, and ``torch.nn.utils.clip_grad_norm_`` (what the
    script calls on DTensor parameters) gives the unsharded model's norm: in the run
    without FSDP2, whose DTensors are the plan's own."""
    resumed = runs["resumed"]
    assert resumed["dtensor_params"], resumed["param_types"]
    kinds = resumed["param_types"]
    assert all(kinds[n] == "DTensor" for n in _frozen_sharded()), kinds
    want = ref["resumed"]["norms"]
    assert _close(resumed["grad_norms"], want), (resumed["grad_norms"], want)


@pytest.mark.timeout(RUNS_TIMEOUT)
def test_own_loop_fsdp2_over_dp_trains_saves_and_resumes(runs, ref) -> None:
    """FSDP2 over ``mesh["dp"]`` instead of averaging gradients: the same losses and norms
    as the unsharded model from the pretrained weights, and its DCP checkpoint resumes in a
    fresh run (without FSDP2) with the trained model."""
    import torch

    fsdp = runs["fsdp"]
    want = ref["pretrained"]
    assert _close(fsdp["losses"], want["losses"]), (fsdp["losses"], want["losses"])
    assert _close(fsdp["grad_norms"], want["norms"]), (fsdp["grad_norms"], want["norms"])
    first, last = fsdp["tensors"]["first"], fsdp["tensors"]["last"]
    assert fsdp["losses"][1] < fsdp["losses"][0]
    assert (last - first).abs().max() > 1e-3
    # the checkpoint holds the trained model: transformers' model reading it, and the fresh
    # run resuming from it, give the trained logits
    assert torch.allclose(ref["resumed"]["logits"], last, atol=1e-5, rtol=0)
    assert torch.allclose(runs["resumed"]["tensors"]["first"], last, atol=1e-5, rtol=0)
