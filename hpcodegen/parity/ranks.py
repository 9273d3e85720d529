"""Real gloo ranks on this host for a parity check: spawn, run one function, collect JSON.

The tests and ``bench/coverage.py`` run their checks on ``world`` CPU processes of one
gloo process group. The rendezvous is a file in the caller's own directory (no free-port
race with other jobs on a shared machine); each rank writes its function's result to
``rank{r}.json`` there. A caller that wants partial results kept when a rank dies can write
that file itself as it goes (:func:`result_path`); the final result overwrites it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def result_path(out_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` leaves its result."""
    return Path(out_dir, f"rank{rank}.json")


def run_rank(rank: int, world: int, init_method: str, out_dir: str, fn: Callable[..., Any],
             args: tuple) -> None:
    """Spawn target: init gloo, run ``fn(*args)``, write its JSON result for this rank."""
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=init_method)
    try:
        result = fn(*args)
        result_path(out_dir, rank).write_text(json.dumps(result))
        # every rank done before any tears its sockets down: a rank closing while a peer
        # still reads the tail of the last collective aborts that peer (seen under load)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(world: int, fn: Callable[..., Any], *args: Any, out_dir: str | Path) -> list[Any]:
    """Run ``fn(*args)`` on ``world`` gloo ranks; the per-rank results, rank order.

    ``fn`` must be importable by the spawned processes (a module-level function). A rank
    that raises fails the whole call (``torch.multiprocessing.ProcessRaisedException``);
    the caller bounds the time (a test's timeout, the coverage script's process timeout).
    """
    import torch.multiprocessing as mp

    init_method = Path(out_dir, "rendezvous").resolve().as_uri()
    mp.spawn(run_rank, args=(world, init_method, str(out_dir), fn, args), nprocs=world,
             join=True)
    return [json.loads(result_path(out_dir, r).read_text()) for r in range(world)]
