"""bench/gpu.py, the GPU lane, where there is no GPU: it refuses with the reason, and its
code runs end to end on the CPU at tiny shapes (``--device cpu --smoke``), so the lane is
ready when a GPU machine runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import bench_main
import pytest

GPU = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"
NO_GPU = not any(os.path.exists(p) for p in ("/dev/nvidia0", "/proc/driver/nvidia/gpus"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GPU), *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(not NO_GPU, reason="an NVIDIA driver is present")
def test_without_cuda_it_exits_2_saying_why() -> None:
    proc = run()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "bench/gpu.py needs a CUDA device" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cpu_smoke_runs_every_part(capsys: pytest.CaptureFixture[str]) -> None:
    """The script's ``main`` in this process (``bench_main``: the exit-2 test above runs it
    as a command; a second interpreter's imports were half of this run's CPU)."""
    code = bench_main.run_main("gpu.py", ["--device", "cpu", "--smoke"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert "llama_tp2        equal" in out and "llama_tp2_sp_lp  equal" in out
    assert "DIFFERS" not in out
    for name in ("llama_tp2", "llama_tp2_sp_lp"):  # part 2: shapes and collectives
        assert re.search(rf"^{name}\s+2\s+ok\s", out, re.M), out
    for arm in ("hpcodegen", "handwritten", "parallelize_module"):
        for mode in ("fwd ", "fwd+bwd"):
            assert any(line.startswith(mode) and f" {arm} " in f" {line} "
                       for line in out.splitlines()), (mode, arm, out)
