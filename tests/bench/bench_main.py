"""A ``bench/`` script's ``main`` run in the test's own process.

A second interpreter for a smoke run paid its start and the imports of torch, transformers
and hpcodegen (about 5 CPU-s) before the script did anything, about half of each smoke
run's CPU; the test process has them imported already. What a script changes outside
itself is put back here, so the tests after it in this worker see the process as before:
torch's intra-op thread count (the CPU benchmarks set one thread), the warning filters, and
the default process group (the scripts run on torch's fake group; one left up by a failed
run would refuse every later fake world).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_main(script: str, argv: list[str]) -> int:
    """``bench/<script>``'s ``main(argv)`` here, its exit code returned (stdout as printed:
    the caller reads it with ``capsys``)."""
    import torch

    from hpcodegen.derive.world import end_world

    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    module = importlib.import_module(Path(script).stem)
    threads = torch.get_num_threads()
    try:
        with warnings.catch_warnings():
            return module.main(argv)
    finally:
        torch.set_num_threads(threads)
        end_world()
