"""``hpcodegen export``: a DCP checkpoint back to config.json + safetensors (in-process,
one-process DCP; the multi-rank save is tested in tests/launch/test_checkpoints.py). The
CLI's refusals run through its entry point in this process (``tests/cli/inproc.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcodegen.checkpoint.record import write_record

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from inproc import run as cli  # the CLI's entry point, in this process

pytestmark = [pytest.mark.timeout(400),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]
REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "configs" / "llama"


def _checkpoint(tmp_path, *, tie: bool = False):
    """A one-process DCP checkpoint of a seeded tiny llama, as ``save`` lays it out."""
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((LLAMA / "config.json").read_text()) | {"tie_word_embeddings": tie}
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    names = dict(model.named_parameters())  # tied: lm_head.weight is not listed again
    ckpt = tmp_path / "ckpt"
    dcp.save({f"model.{n}": p.detach() for n, p in names.items()}, checkpoint_id=str(ckpt),
             no_dist=True)
    write_record(ckpt, {"config": config, "dtype": "float32", "step": 0,
                        "params": {n: {"shape": list(p.shape), "placements": {}}
                                   for n, p in names.items()},
                        "aliases": {"lm_head.weight": "model.embed_tokens.weight"} if tie else {}})
    return model, ckpt


def _export(*args) -> subprocess.CompletedProcess:
    return cli("export", *args, cwd=REPO)


@pytest.mark.parametrize("tie", [False, True])
def test_export_split_files_load_in_transformers(tmp_path, tie) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hpcodegen.checkpoint.export import export_hf

    model, ckpt = _checkpoint(tmp_path, tie=tie)
    out = export_hf(ckpt, tmp_path / "hf", max_shard_bytes=150_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and files == sorted(p.name for p in out.glob("*.safetensors"))
    saved = {}
    for name in files:
        saved.update(load_file(str(out / name)))
    want = dict(model.named_parameters())
    assert sorted(saved) == sorted(want) and ("lm_head.weight" in saved) is not tie
    assert all(torch.equal(saved[n], p) for n, p in want.items())
    loaded = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.randint(0, 256, (1, 6))
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert not list(tmp_path.glob(".*partial"))


def test_export_refusals(tmp_path) -> None:
    run = _export(tmp_path, "-o", tmp_path / "out")
    assert run.returncode == 2 and "not an hpcodegen checkpoint" in run.stderr
    _, ckpt = _checkpoint(tmp_path)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    run = _export(ckpt, "-o", tmp_path / "busy", "--json")
    doc = json.loads(run.stdout)
    assert run.returncode == 2 and doc["status"] == "error" and doc["verb"] == "export"
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"
    assert "Traceback" not in run.stderr
