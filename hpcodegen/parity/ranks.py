"""Real gloo ranks on this host for a parity check: spawn, run one function, collect JSON.

The tests and ``bench/coverage.py`` run their checks on ``world`` CPU processes of one
gloo process group. The rendezvous is a file in the caller's own directory (no free-port
race with other jobs on a shared machine); each rank writes its function's result to
``rank{r}.json`` there. A caller that wants partial results kept when a rank dies can write
that file itself as it goes (:func:`result_path`); the final result overwrites it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcodegen.gc_pause import MODEL_STACK


def result_path(out_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` leaves its result."""
    return Path(out_dir, f"rank{rank}.json")


def run_rank(rank: int, world: int, init_method: str, out_dir: str, fn: Callable[..., Any],
             args: tuple) -> None:
    """Spawn target: init gloo, run ``fn(*args)``, write its JSON result for this rank."""
    import torch.distributed as dist

    _one_thread()
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=init_method)
    try:
        result = fn(*args)
        result_path(out_dir, rank).write_text(json.dumps(result))
        # every rank done before any tears its sockets down: a rank closing while a peer
        # still reads the tail of the last collective aborts that peer (seen under load)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _one_thread() -> None:
    """One intra-op thread per rank, as torchrun's ``OMP_NUM_THREADS=1`` gives each of its
    ranks: the ranks share the machine's cores. Set on torch itself: a rank forked from the
    fork server inherits a torch whose OpenMP runtime read the environment when the server
    imported it (``OMP_NUM_THREADS`` set here would come too late: 2 threads per rank on a
    2-core machine, each rank's parallel regions spinning against the others)."""
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what the rank's own children inherit
    torch.set_num_threads(1)


#: what the rank processes' parent imports once: every rank is then a fork of it, so a
#: start costs about a second where a fresh interpreter importing these costs several.
#: ``transformers.modeling_utils`` (every model class imports it) and DTensor are most of
#: a rank's imports: preloaded, a second world of the same process started in 0.4 s where
#: it took 23 s with the three top-level packages alone (2 ranks, loaded 2-core box). None
#: of them starts a thread, so forking the server stays safe.
PRELOAD = list(MODEL_STACK)


def _context() -> Any:
    """The multiprocessing context of the ranks: a fork server that has imported
    :data:`PRELOAD` (no threads run in it, so forking it is safe), where the platform has
    one; else fresh interpreters."""
    import torch.multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def spawn(world: int, fn: Callable[..., Any], *args: Any, out_dir: str | Path) -> list[Any]:
    """Run ``fn(*args)`` on ``world`` gloo ranks; the per-rank results, rank order.

    ``fn`` must be importable by the spawned processes (a module-level function). A rank
    that raises fails the whole call (``torch.multiprocessing.ProcessRaisedException``);
    the caller bounds the time (a test's timeout, the coverage script's process timeout).
    """
    import torch.multiprocessing as mp

    init_method = Path(out_dir, "rendezvous").resolve().as_uri()
    context = _context()
    mp.start_processes(run_rank, args=(world, init_method, str(out_dir), fn, args),
                       nprocs=world, join=True,
                       start_method=context.get_start_method())
    return [json.loads(result_path(out_dir, r).read_text()) for r in range(world)]


class GlooWorld:
    """``world`` gloo ranks started once and kept for several checks (the test suite's).

    Each :meth:`run` sends ``fn(*args)`` to every rank and returns the per-rank results,
    as :func:`spawn` does, without paying the process start and the imports again. A rank
    that raises, or a :meth:`run` that does not return (a timeout interrupting it), ends
    the whole world: the next :meth:`run` starts a fresh one, so no check inherits a
    process group in an unknown state. The caller's ``sys.path`` travels with each job
    (a test directory's worker modules resolve in the ranks).
    """

    def __init__(self, world: int, directory: str | Path) -> None:
        self.world = world
        self.directory = Path(directory)
        self._procs: list[Any] = []
        self._jobs: list[Any] = []
        self._results: Any = None
        self._starts = 0

    def _start(self) -> None:
        ctx = _context()
        self._starts += 1
        init = (self.directory / f"rendezvous{self._starts}").resolve().as_uri()
        self._jobs = [ctx.SimpleQueue() for _ in range(self.world)]
        self._results = ctx.SimpleQueue()
        self._procs = [ctx.Process(target=_serve, daemon=True,
                                   args=(r, self.world, init, self._jobs[r], self._results))
                       for r in range(self.world)]
        for proc in self._procs:
            proc.start()

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(*args)`` on every rank; the JSON-able results in rank order."""
        if not self._procs or not all(p.is_alive() for p in self._procs):
            self.close()
            self._start()
        job = pickle.dumps((list(sys.path), pickle.dumps((fn, args))))
        done: dict[int, Any] = {}
        try:
            for queue in self._jobs:
                queue.put(job)
            while len(done) < self.world:
                rank, ok, value = self._next_result()
                if not ok:
                    raise RuntimeError(f"rank {rank} raised:\n{value}")
                done[rank] = json.loads(value)
        except BaseException:
            self.close()
            raise
        return [done[r] for r in range(self.world)]

    def _next_result(self) -> tuple[int, bool, str]:
        """The next rank's answer; a rank that died without one fails the run."""
        while True:
            if not self._results.empty():
                return self._results.get()
            dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
            if dead and self._results.empty():
                raise RuntimeError(f"rank {dead[0]} died (exit {self._procs[dead[0]].exitcode})")
            time.sleep(0.05)

    def close(self) -> None:
        """End every rank (killed when it does not stop at once)."""
        for queue, proc in zip(self._jobs, self._procs, strict=False):
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    queue.put(None)
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs, self._jobs = [], []


def _serve(rank: int, world: int, init_method: str, jobs: Any, results: Any) -> None:
    """A kept rank: gloo up once, then each job from ``jobs`` until ``None``; after a job
    that raised the rank leaves (its process group may be mid-collective)."""
    import traceback

    import torch.distributed as dist

    _one_thread()
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=init_method)
    try:
        while (job := _next_job(jobs)) is not None:
            fn, args = _unpickled(job)
            try:
                value = json.dumps(fn(*args))
                # every rank done before the next job: as in run_rank
                dist.barrier()
            except BaseException:
                results.put((rank, False, traceback.format_exc()[-3000:]))
                return
            results.put((rank, True, value))
    finally:
        dist.destroy_process_group()


def _next_job(jobs: Any) -> bytes | None:
    """The next job, or None to stop: also when the process that started this rank is
    gone (killed without closing its world), so no rank outlives its test run."""
    parent = os.getppid()
    while not jobs._reader.poll(1.0):
        if os.getppid() != parent:
            return None
    return jobs.get()


def _unpickled(job: bytes) -> tuple[Any, tuple]:
    """The job's function and arguments, its sender's ``sys.path`` entries added first so
    that the function (a test directory's worker) resolves."""
    path, payload = pickle.loads(job)
    sys.path[:0] = [p for p in path if p not in sys.path]
    return pickle.loads(payload)
