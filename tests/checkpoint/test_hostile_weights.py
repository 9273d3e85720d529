"""Hostile weights directories (issue 23): refused by stat before anything opens them,
never broadcast into a buffer, never read in a dtype they do not have."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from hpcodegen.errors import PlanError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from inproc import run as cli  # the CLI's entry point, in this process

pytestmark = pytest.mark.timeout(450)
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama_tp2"
LLAMA = REPO / "examples" / "configs" / "llama"


def _with_buffer():
    import torch

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 6)
            self.register_buffer("scale", torch.ones(4))

    return M()


def _load(directory: Path):
    from hpcodegen.checkpoint import ShardLayout, materialize, parameters_on_meta
    from hpcodegen.checkpoint.layout import global_shapes
    from hpcodegen.checkpoint.safetensors_io import SafetensorsCheckpoint

    with parameters_on_meta():
        model = _with_buffer()
    layout = ShardLayout.from_model(model, global_shapes(model), None)
    import torch

    materialize(model, layout, dtype=torch.float32, device="cpu",
                checkpoint=SafetensorsCheckpoint(directory))
    return model


def _weights(**extra):
    import torch

    return {"proj.weight": torch.ones(6, 4), "proj.bias": torch.ones(6), **extra}


def test_a_buffer_of_another_shape_is_refused_not_broadcast(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file(_weights(scale=torch.full((1,), 7.0)), str(tmp_path / "model.safetensors"))
    with pytest.raises(PlanError) as info:
        _load(tmp_path)
    assert info.value.findings[0].code == "launch.weights_shape"
    assert "scale: file (1,), model (4,)" in info.value.findings[0].message
    save_file(_weights(scale=torch.full((4,), 7.0)), str(tmp_path / "model.safetensors"))
    assert torch.equal(_load(tmp_path).scale, torch.full((4,), 7.0))


def test_a_dtype_the_reader_does_not_know_is_refused(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file(_weights(**{"proj.bias": torch.ones(6, dtype=torch.float8_e4m3fn)}),
              str(tmp_path / "model.safetensors"))
    with pytest.raises(PlanError) as info:
        _load(tmp_path)
    assert "F8_E4M3" in info.value.findings[0].message


@pytest.mark.parametrize("kind", ["fifo", "directory", "fifo index"])
def test_a_weights_file_that_is_not_regular_is_refused_before_any_rank(tmp_path, kind) -> None:
    """launch exits 2 naming the file; nothing opened it (a FIFO would block forever)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((LLAMA / "config.json").read_text())
    if kind == "fifo":
        os.mkfifo(model_dir / "model.safetensors")
    elif kind == "directory":
        (model_dir / "model.safetensors").mkdir()
    else:
        os.mkfifo(model_dir / "model.safetensors.index.json")
    opened = threading.Event()

    def watch() -> None:  # a writer-side open returns only when a reader opened the FIFO
        fifo = next(p for p in model_dir.iterdir() if p.is_fifo())
        fd = os.open(fifo, os.O_WRONLY)
        opened.set()
        os.close(fd)

    watcher = threading.Thread(target=watch, daemon=True) if kind != "directory" else None
    if watcher is not None:
        watcher.start()
    run = cli("launch", EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", model_dir,
              "--json", "--timeout", "300", cwd=REPO)  # its pre-start check, in this process
    doc = json.loads(run.stdout)
    assert run.returncode == 2 and doc["status"] == "error", run.stderr
    assert [f["code"] for f in doc["findings"]] == ["launch.weights_unreadable"]
    assert not opened.is_set(), "the launcher opened the FIFO"
    if watcher is not None:  # release the watcher
        fd = os.open(next(p for p in model_dir.iterdir() if p.is_fifo()),
                     os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
