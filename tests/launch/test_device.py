"""Device/backend resolution with the accelerator modules faked (the one place fakes are
allowed: this machine has neither CUDA nor an Ascend NPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

from hpcodegen.errors import UsageError
from hpcodegen.launch.rank.device import built_without_gpu, resolve_device


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_npu(monkeypatch):
    """A ``torch_npu`` plugin that, like the real one, installs ``torch.npu`` on import."""
    calls: dict[str, list] = {"set_device": []}
    npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 4,
                                set_device=lambda i: calls["set_device"].append(i))
    plugin = types.ModuleType("torch_npu")
    monkeypatch.setitem(sys.modules, "torch_npu", plugin)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    return calls


def test_cpu_is_gloo():
    assert (resolve_device("cpu").kind, resolve_device("cpu").backend) == ("cpu", "gloo")


def test_auto_without_accelerators_is_cpu(no_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu -> ImportError
    assert resolve_device("auto").backend == "gloo"


def test_cuda_is_nccl(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert resolve_device("cuda", nproc=8).backend == "nccl"
    assert resolve_device("auto", nproc=2).kind == "cuda"


def test_more_ranks_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UsageError, match="only 2 cuda"):
        resolve_device("cuda", nproc=4)


def test_auto_passes_over_too_few_gpus(monkeypatch):
    """`make demo` (2 ranks, --device auto) on a one-GPU machine runs on CPU, and says so."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    choice = resolve_device("auto", nproc=2)
    assert (choice.kind, choice.backend) == ("cpu", "gloo")
    assert choice.note == "--device auto chose cpu: only 1 cuda device(s) for 2 ranks"
    assert resolve_device("auto", nproc=1).kind == "cuda"


def test_npu_is_hccl_through_torch_npu(no_cuda, fake_npu):
    assert resolve_device("npu", nproc=4).backend == "hccl"
    assert resolve_device("auto", nproc=2).kind == "npu"


FAKE_TORCH_NPU = """
import types, torch
torch.utils.rename_privateuse1_backend("npu")  # what the real plugin does on import
calls = []
torch.npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2,
                                  set_device=calls.append)
"""


def test_npu_binds_local_rank(tmp_path):
    """In a fresh interpreter: renaming torch's privateuse1 backend cannot be undone."""
    (tmp_path / "torch_npu.py").write_text(FAKE_TORCH_NPU)
    code = ("import torch, torch_npu; torch.cuda.is_available = lambda: False\n"
            "from hpcodegen.launch.rank.device import bind_device, resolve_device\n"
            "choice = resolve_device('auto', nproc=2)\n"
            "dev = bind_device(choice.kind, 1)\n"
            "print(choice.kind, choice.backend, dev, torch_npu.calls)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["npu", "hccl", "npu:1", "[1]"]


def test_too_many_npu_ranks_names_ascend_visible_devices(no_cuda, fake_npu):
    with pytest.raises(UsageError, match="ASCEND_RT_VISIBLE_DEVICES"):
        resolve_device("npu", nproc=8)


def test_missing_device_is_a_usage_error(no_cuda, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(UsageError, match="no cuda device"):
        resolve_device("cuda")
    with pytest.raises(UsageError, match="torch_npu"):
        resolve_device("npu")


def test_unknown_kind():
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        resolve_device("tpu")


@pytest.mark.parametrize(("text", "no_gpu"), [
    (b"__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n",
     True),
    (b"cuda = None\nhip = None\n", True),
    (b"cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", False),
    (b"cuda: Optional[str] = None\nhip: Optional[str] = '6.4.0'\n", False),
    (b"cuda = None\n", False),  # hip not recorded: not proof
    (b"cuda = _detect()\nhip = None\n", False),
    (b"cuda = None\nhip = None\ncuda = '12.8'\n", False),  # the last assignment counts
    (b"cuda = (\n", False),
])
def test_a_torch_build_without_cuda_or_rocm_is_read_from_its_version_file(text, no_gpu):
    """``--device auto``'s launcher skips importing torch only on this proof."""
    assert built_without_gpu(text) is no_gpu


def test_this_torch_build_is_read_as_torch_itself_says():
    from pathlib import Path

    source = (Path(torch.__file__).parent / "version.py").read_bytes()
    assert built_without_gpu(source) is (torch.version.cuda is None and torch.version.hip is None)
