"""Suite-wide settings.

Text output folds to ``COLUMNS`` (80 when unset and piped). Tests that search messages for
a path or a phrase read them unfolded at 400 columns; ``tests/cli/test_cli_conventions.py``
checks the folding itself with ``COLUMNS=80``.

Tests marked ``cuda(n)`` need ``n`` CUDA devices (default 1) and are skipped, with the
reason, where fewer are visible. The count is asked of torch in a child process, and only
when such a test was collected: this process never imports torch for it (tests assert
that the pure core leaves torch unloaded).
"""

import os
import subprocess
import sys
from functools import cache

import pytest

os.environ["COLUMNS"] = "400"


@cache
def cuda_devices() -> int:
    """CUDA devices torch sees here (0 without the driver or a CUDA build of torch)."""
    if not any(os.path.exists(p) for p in ("/dev/nvidia0", "/proc/driver/nvidia/gpus")):
        return 0  # no NVIDIA driver: no need to start torch to know
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, check=True).stdout
        return int(out.split()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("cuda")
        if marker is None:
            continue
        need = int(marker.args[0]) if marker.args else 1
        have = cuda_devices()
        if have < need:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {need} CUDA device(s), {have} visible"))
