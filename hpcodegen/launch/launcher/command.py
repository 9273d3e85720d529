"""The exact torchrun command line and the environment every rank gets.

torchrun is started as ``python -m hpcodegen.launch.launcher.torchrun`` (``torch.distributed.run``
itself, keeping its per-rank failure records for the launcher) with the launcher's own
interpreter, so the ranks run in the same virtualenv. One node without rendezvous options
uses ``--standalone`` (a local c10d store on a free port, chosen by torchrun); multi-node
options are passed through unchanged. ``--max-restarts 0``: a failed rank fails the job
(the launcher reports it) instead of restarting the whole world.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from hpcodegen.launch import env
from hpcodegen.launch.launcher.options import LaunchOptions

WORKER_MODULE = "hpcodegen.launch.rank.worker"
TORCHRUN_MODULE = "hpcodegen.launch.launcher.torchrun"


def torchrun_argv(opts: LaunchOptions, *, log_dir: Path | None, tee: bool) -> list[str]:
    """``[python, -m, TORCHRUN_MODULE, ...torchrun options, -m, WORKER_MODULE, ...script]``.

    Args:
        opts: the launch request.
        log_dir: torchrun ``--log-dir`` (per-rank ``stdout.log``/``stderr.log``); None: none.
        tee: also copy the ranks' stdout to the console (user scripts); their stderr
            (warnings, tracebacks) stays in the logs.
    """
    argv = [sys.executable, "-m", TORCHRUN_MODULE]
    if opts.multi_node:
        argv += ["--nnodes", opts.nnodes]
        if opts.node_rank is not None:
            argv += ["--node-rank", str(opts.node_rank)]
        if opts.rdzv_endpoint:
            argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", opts.rdzv_endpoint]
        if opts.rdzv_id:
            argv += ["--rdzv-id", opts.rdzv_id]
        if opts.master_addr:
            argv += ["--master-addr", opts.master_addr]
        if opts.master_port is not None:
            argv += ["--master-port", str(opts.master_port)]
    else:
        argv += ["--standalone", "--nnodes", "1"]
    argv += ["--nproc-per-node", str(opts.nproc), "--max-restarts", "0"]
    if log_dir is not None:
        argv += ["--log-dir", str(log_dir), "--redirects", "3"]
        if tee:
            argv += ["--tee", "1"]
    argv += ["-m", WORKER_MODULE, *opts.script]
    return argv


def job_environment(opts: LaunchOptions, *, run_dir: Path, device: str) -> dict[str, str]:
    """The ``HPCODEGEN_*`` variables every rank of this node gets (see ``env``)."""
    out = {
        env.ARTIFACT: str(Path(opts.artifact).resolve()),
        env.RUN_DIR: str(run_dir.resolve()),
        env.DEVICE: device,
        env.STEPS: str(opts.steps),
        env.CHECK_PARITY: "1" if opts.check_parity else "0",
        env.SEED: str(opts.seed),
        env.TOLERANCE: repr(opts.parity_tolerance),
        env.DTYPE: opts.dtype,
    }
    for name, value in ((env.SAVE, opts.save), (env.RESUME, opts.resume)):
        if value is not None:
            out[name] = str(Path(value).resolve())
    if opts.max_grad_norm is not None:
        out[env.MAX_GRAD_NORM] = repr(opts.max_grad_norm)
    if opts.compile:
        out[env.COMPILE] = opts.compile
        if opts.compile_backend:
            out[env.COMPILE_BACKEND] = opts.compile_backend
    if opts.model_dir is not None:
        out[env.MODEL_DIR] = str(Path(opts.model_dir).resolve())
    if opts.allow_target:
        out[env.ALLOW_TARGETS] = ",".join(opts.allow_target)
    if env.get(env.FAULT):
        out[env.FAULT] = env.get(env.FAULT)
    return out


def rank_environments(opts: LaunchOptions, job_env: Mapping[str, str]) -> list[dict[str, str]]:
    """What each local rank will see: torchrun's variables plus the job's (for --dry-run).

    With one node the global rank equals the local rank; with several, torchrun's
    rendezvous assigns global ranks, shown as ``node_rank * nproc + local_rank`` for a
    static layout or ``<assigned>`` for an elastic one.
    """
    nodes = opts.nnodes
    world = str(opts.min_world_size()) if ":" not in nodes else "<assigned>"
    out = []
    for local in range(opts.nproc):
        if opts.multi_node and opts.node_rank is None:
            rank = "<assigned>"
        else:
            rank = str((opts.node_rank or 0) * opts.nproc + local)
        out.append({"RANK": rank, "LOCAL_RANK": str(local), "WORLD_SIZE": world,
                    "LOCAL_WORLD_SIZE": str(opts.nproc), **job_env})
    return out
