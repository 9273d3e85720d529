"""``hpcodegen launch``: check the request, start torchrun, report every rank.

Order matters: everything that can be refused (options, the meta, the world size against
the frozen mesh, the HF config, the device) is checked before a process starts, so those
mistakes are exit-2 usage errors that start nothing. Then torchrun runs under
``supervise.run_job`` and the verdict comes from the ranks' own result files.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcodegen.artifact.load import load_meta
from hpcodegen.errors import EXIT_OK, HpcodegenError, InputError, UsageError, error, printable
from hpcodegen.hf import read_hf_config
from hpcodegen.launch.launcher import display
from hpcodegen.launch.launcher.command import job_environment, rank_environments, torchrun_argv
from hpcodegen.launch.launcher.deathsig import wrap
from hpcodegen.launch.launcher.options import LaunchOptions
from hpcodegen.launch.launcher.supervise import run_job
from hpcodegen.launch.launcher.verdict import verdict
from hpcodegen.launch.rank.device import resolve_device
from hpcodegen.launch.rank.mesh import MeshLayout, resolve_mesh_layout


def _prepare(opts: LaunchOptions, began: float) -> tuple[MeshLayout, str, LaunchOptions]:
    """Every pre-start check; returns the mesh layout, device kind and completed options.

    The artifact is checked as the runtime will check it on every rank (schema, plan,
    output hashes; architecture, structure and signature against the config when there is
    one), so a drifted artifact or a config of another model is refused once, here,
    instead of N times. With a config, verify's model check runs last, in a child process
    (:mod:`hpcodegen.launch.launcher.model_check`), inside what is left of ``--timeout``
    since ``began``; ``--dry-run`` starts nothing and skips it.
    """
    from hpcodegen.extras import require
    from hpcodegen.verify import RUNTIME_CHECKS, load_checked_meta, refuse_bare

    require("runtime", "hpcodegen launch", ("torch", "transformers", "safetensors", "psutil"))
    opts.check()
    loaded = load_meta(opts.artifact)  # unreadable input: exit 2 before any check runs
    refuse_bare(loaded)  # a meta file alone: nothing to run
    model_dir = opts.model_dir or (None if opts.script else loaded.artifact_dir)
    config, config_path = None, None
    if model_dir is not None:  # a Hub id becomes its cached snapshot dir (weights included)
        from hpcodegen.checkpoint.weight_files import weight_files

        config, config_path = _model_config(model_dir, given=opts.model_dir is not None)
        model_dir = config_path.parent
        if opts.resume is None:  # a FIFO named *.safetensors: refused before a rank opens it
            try:
                weight_files(model_dir)
            except HpcodegenError as exc:  # unusable input, as an unreadable config
                raise InputError(exc.findings) from None
    checks = (*RUNTIME_CHECKS, "signature") if config is not None else RUNTIME_CHECKS
    meta = load_checked_meta(opts.artifact, checks, hf_config=config,
                             allowed_targets=opts.allow_target)
    layout = resolve_mesh_layout(meta.plan, opts.min_world_size())
    if opts.resume is not None:  # a damaged or another model's checkpoint: refused here
        from hpcodegen.checkpoint.record import check_same_model, read_record

        check_same_model(read_record(opts.resume, checked=False), config or {}, opts.resume)
        # imported only now: it reads DCP's metadata (torch), which a record of another
        # model or no record at all never needs
        from hpcodegen.checkpoint.integrity import open_checkpoint

        open_checkpoint(opts.resume, digests="none")  # the ranks share hashing the files
    if opts.compile_backend is not None:
        _check_compile_backend(opts.compile_backend)
    device = resolve_device(opts.device, opts.nproc)
    if config is not None and not opts.dry_run:  # last: the only check that takes seconds
        _model_check(opts, meta.artifact_dir, config_path, began)
    if device.note and not opts.json and opts.verbosity >= 0:
        print(f"[launch] note: {device.note}", file=sys.stderr)
    crowded = _oversubscribed(opts, device.kind)
    if crowded:  # stderr also with --json: stdout holds the one document
        print(f"[launch] warning: {crowded}", file=sys.stderr)
    opts = replace(opts, artifact=meta.artifact_dir,
                   model_dir=Path(model_dir) if model_dir is not None else None)
    return layout, device.kind, opts


def _check_compile_backend(name: str) -> None:
    """A named ``--compile-backend`` must be one ``torch.compile`` resolves here (dynamo's
    registry, plugins' ``torch_dynamo_backends`` entry points included): refused before any
    rank starts instead of failing every rank at its first compiled call. Only a named
    backend pays for importing dynamo in the launcher."""
    from torch._dynamo import list_backends
    from torch._dynamo.backends.registry import lookup_backend
    from torch._dynamo.exc import InvalidBackend

    try:
        lookup_backend(name)
    except InvalidBackend:
        # torch's production backends and the eager/AOT ones it tags "debug" (dynamo's
        # minifier and test-only entries left out)
        known = sorted({*list_backends(), "aot_eager", "eager"})
        raise UsageError([error("launch.compile_backend", "--compile-backend",
                                f"torch.compile has no backend {name!r} here",
                                expected=f"one of: {', '.join(known)}")]) from None


def _model_check(opts: LaunchOptions, artifact: Path, config_path: Path, began: float) -> None:
    """verify's model check in a child process; its warnings on stderr when it passes.
    A recorded pass for the same bytes (:mod:`hpcodegen.launch.launcher.check_cache`)
    stands in for the child."""
    from hpcodegen.launch.launcher.check_cache import CACHE_ENV, cache_dir
    from hpcodegen.launch.launcher.deadline import left
    from hpcodegen.launch.launcher.model_check import cached_model_check, run_model_check

    cache = cache_dir()
    talk = not opts.json and opts.verbosity >= 0
    warnings = cached_model_check(artifact, config_path, opts.allow_target, cache)
    if warnings is not None:
        if talk:
            print(f"[launch] model check: passed before for these exact bytes (verdict cached "
                  f"in {cache}; {CACHE_ENV}=off re-checks)", file=sys.stderr, flush=True)
    else:
        if talk:
            print("[launch] model check (hpcodegen verify --only model) before any rank "
                  "starts", file=sys.stderr, flush=True)
        warnings = run_model_check(artifact, config_path, opts.allow_target,
                                   timeout=left(opts.timeout, began), cache=cache)
    if opts.verbosity >= 0:
        for finding in warnings:
            print(f"[launch] warning: {finding.render()}", file=sys.stderr)


def _model_config(model_dir: str | Path, *, given: bool) -> tuple[dict, Path]:
    """The model's HF config; when ``--model-dir`` was not given and the artifact directory
    holds none, the error names the flag that supplies it."""
    try:
        return read_hf_config(model_dir)
    except InputError as exc:
        if given:
            raise
        found = exc.findings[0] if exc.findings else None
        what = found.message if found is not None else "no HF config found"
        raise InputError([error(
            "launch.no_model_config", str(model_dir),
            f"the artifact directory holds no HF config.json ({what}) and no --model-dir "
            "was given", expected="--model-dir DIR: a directory with the model's config.json "
            "(and its *.safetensors weights, if any), or a Hub id (org/name) in the local "
            "HF cache", hint=f"hpcodegen launch {model_dir} --model-dir MODEL_DIR ...")]
        ) from None


#: stands for the launcher's pid in --dry-run (the shim exits when that process is gone)
LAUNCHER_PID = "<launcher-pid>"


def _dry_run(opts: LaunchOptions, layout: MeshLayout, argv: list[str],
             job_env: dict[str, str]) -> int:
    """The exact command the launcher would start, wrapper included, and each rank's env."""
    envs = rank_environments(opts, job_env)
    exec_argv = wrap(argv, LAUNCHER_PID)
    if opts.json:
        display.print_json(EXIT_OK, dry_run=True, argv=argv, exec_argv=exec_argv,
                           mesh=dict(zip(layout.names, layout.sizes, strict=True)),
                           rank_env=envs)
        return EXIT_OK
    import shlex

    from hpcodegen.report.terminal import fold_command, fold_text

    print(f"# mesh {layout.describe()}")
    if exec_argv != argv:
        print(fold_text(f"# torchrun runs under hpcodegen.launch.launcher.deathsig, which ends "
                        f"it if the launcher dies; {LAUNCHER_PID} is the launcher's pid", "# "))
    print(fold_command([shlex.quote(a) for a in exec_argv]))
    for rank_env in envs:
        print(f"# local rank {rank_env['LOCAL_RANK']}:")
        print(fold_command([f"{k}={shlex.quote(v)}" for k, v in rank_env.items()]))
    return EXIT_OK


def _run_dir(opts: LaunchOptions, create: bool) -> Path:
    if opts.log_dir is not None:
        path = Path(opts.log_dir) / "results"
        if create:
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError([error("launch.log_dir", "--log-dir",
                                        f"cannot create {path}: {exc.strerror or exc}")]) from None
        return path
    if create:
        return Path(tempfile.mkdtemp(prefix="hpcodegen-launch-"))
    return Path(tempfile.gettempdir()) / "hpcodegen-launch-XXXXXX"


def _refuse(exc: HpcodegenError, opts: LaunchOptions, err: Any) -> int:
    """Report a request refused before anything started; its exit code."""
    for finding in exc.findings:
        err.print(f"error: {finding.render()}", markup=False)
    if opts.json:  # the documented shape on stdout even when nothing started
        display.print_json(exc.exit_code, exc.findings, message=str(exc))
    return exc.exit_code


def run_launch(opts: LaunchOptions) -> int:
    """Run one launch and return its exit code (0 only when every rank succeeded).

    Example::

        code = run_launch(LaunchOptions(artifact=Path("examples/llama_tp2"), nproc=2,
                                        model_dir=Path("examples/configs/llama"),
                                        check_parity=True))
    """
    import time

    from hpcodegen.launch.launcher.deadline import deadline

    err = display.make_console(stderr=True)
    began = time.monotonic()
    try:
        with deadline(opts.timeout if not opts.dry_run else None):
            layout, device, opts = _prepare(opts, began)
    except HpcodegenError as exc:
        return _refuse(exc, opts, err)
    try:
        run_dir = _run_dir(opts, create=not opts.dry_run)
    except HpcodegenError as exc:
        return _refuse(exc, opts, err)
    logs = Path(opts.log_dir) if opts.log_dir else run_dir / "logs"
    argv = torchrun_argv(opts, log_dir=logs, tee=bool(opts.script))
    job_env = job_environment(opts, run_dir=run_dir, device=device)
    if opts.dry_run:
        return _dry_run(opts, layout, argv, job_env)
    if opts.verbosity > 0 and not opts.json:
        import shlex

        from hpcodegen.report.terminal import fold_command

        print(fold_command([shlex.quote(a) for a in wrap(argv)]), file=sys.stderr)
    return _execute(opts, layout, argv, job_env, run_dir, logs, began)


def _execute(opts: LaunchOptions, layout: MeshLayout, argv: list[str],
             job_env: dict[str, str], run_dir: Path, logs: Path, began: float) -> int:
    from hpcodegen.launch.launcher.deadline import left
    from hpcodegen.launch.rank.memory import oom_kills

    live = _Progress(opts, layout)
    console_log = logs / "torchrun.log"  # torchrun's banners and tracebacks: never the console
    console_log.parent.mkdir(parents=True, exist_ok=True)
    oom_before = oom_kills()
    with live:
        outcome = run_job(argv, {**os.environ, **job_env}, run_dir=run_dir,
                          expected=opts.nproc, timeout=left(opts.timeout, began),
                          console_log=console_log,
                          script_stdout=bool(opts.script), keep_stdout=not opts.json,
                          on_update=live.update)
    oom_after = oom_kills()
    oom = oom_after - oom_before if oom_before is not None and oom_after is not None else None
    code, message = verdict(outcome, opts, logs, run_dir, console_log, oom)
    # a passing job's scratch dir is removed (unless --log-dir): never report a deleted path
    keep = code != EXIT_OK or opts.log_dir is not None
    if not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    if opts.json:
        findings = [] if code == EXIT_OK else [error("launch.failed", "", message)]
        display.print_json(
            code, findings, message=message,
            mesh=dict(zip(layout.names, layout.sizes, strict=True)),
            elapsed_s=round(outcome.elapsed, 3), timed_out=outcome.timed_out,
            torchrun_returncode=outcome.returncode, pids=outcome.pids,
            run_dir=str(run_dir) if keep else None,
            log_dir=str(logs) if logs and keep else None,
            ranks=[r.to_json() for _, r in sorted(outcome.records.items())])
    else:
        out = display.make_console()
        if opts.verbosity >= 0 or code != EXIT_OK:
            out.print(display.rank_table(outcome.records, _expected(opts),
                                         _title(opts, layout), script=bool(opts.script)))
            for line in (*display.batch_lines(outcome.records),
                         *display.loss_lines(outcome.records)):
                out.print(line, markup=False)
        stream = out if code == EXIT_OK else display.make_console(stderr=True)
        stream.print(message, markup=False)
        for line in _script_traceback(opts, outcome):
            stream.print(line, markup=False, highlight=False)
    return code


def _script_traceback(opts: LaunchOptions, outcome: Any) -> list[str]:
    """For a user script that raised, the tail of its own traceback, marked as such."""
    rec = outcome.records.get(outcome.blamed) if outcome.blamed is not None else None
    if not opts.script or rec is None or not rec.traceback:
        return []
    head = (f"traceback of {Path(opts.script[0]).name} on rank {rec.rank} "
            f"(last {len(rec.traceback)} lines; the full log is named above):")
    return [head, *(f"  | {printable(line)}" for line in rec.traceback)]


def _oversubscribed(opts: LaunchOptions, device: str) -> str | None:
    """A warning when more CPU ranks than cores run on this node (each rank then gets a
    fraction of a core; collectives time out more easily)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    if device != "cpu" or opts.nproc <= cores:
        return None
    return (f"{opts.nproc} CPU ranks on {cores} core{'s' if cores != 1 else ''}: the ranks "
            "share the cores and run slower; fewer ranks or --device cuda/npu avoid that")


def _expected(opts: LaunchOptions) -> int:
    return 0 if opts.multi_node else opts.nproc


def _title(opts: LaunchOptions, layout: MeshLayout) -> str:
    job = " ".join(opts.script) if opts.script else "smoke"
    return f"hpcodegen launch {Path(opts.artifact).name}: {job}, mesh {layout.describe()}"


class _Progress:
    """Live rank table on a terminal; one line per phase change on stderr otherwise."""

    def __init__(self, opts: LaunchOptions, layout: MeshLayout) -> None:
        self.opts, self.layout = opts, layout
        self.console = display.make_console(stderr=True)
        self.live: Any = None
        self.last: dict[int, str] = {}
        self.quiet = opts.json or opts.verbosity < 0

    def __enter__(self) -> _Progress:
        if not self.quiet and not self.opts.script and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(display.rank_table({}, _expected(self.opts),
                                                _title(self.opts, self.layout)),
                             console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        elif not self.quiet:
            print(f"[launch] starting {self.opts.nproc} rank(s), mesh "
                  f"{self.layout.describe()}", file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, records: dict) -> None:
        if self.live is not None:
            self.live.update(display.rank_table(records, _expected(self.opts),
                                                _title(self.opts, self.layout)))
            return
        if self.quiet:
            return
        for rank, rec in sorted(records.items()):
            line = display.progress_line(rec)
            if self.last.get(rank) != line:
                self.last[rank] = line
                print(line, file=sys.stderr, flush=True)

