"""``hpcodegen verify``: load each artifact, run the chosen checks, report, return an exit code.

Also :func:`load_checked_meta`, the same load-and-check path for the runtime (no torch), so a
drifted or malformed artifact is refused before anything imports it.

The ``--json`` document (stable; docs/verify.md)::

    {"ok": bool,
     "artifacts": [{"path": str, "ok": bool,
                    "checks": {"<check>": {"status": "pass" | "fail" | "skipped",
                                           "reason": str | null,
                                           "findings": [{"code", "severity", "path", "file",
                                                         "message", "expected", "hint"}]}}}]}

An unreadable meta appears as the single check ``load`` with status ``fail``; an unreadable
``--hf-config`` fails ``signature`` and ``model``. Exit codes: 0 every check passed (warnings
allowed unless ``strict``), 1 a check failed, 2 usage error or an unreadable input.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, TextIO

from hpcodegen.artifact.load import META_NAME, LoadedMeta, load_meta
from hpcodegen.atomic import write_atomic
from hpcodegen.checks.context import CheckContext
from hpcodegen.checks.files import INIT_NAME, MODELING_GLOB
from hpcodegen.checks.registry import run_checks, select_checks
from hpcodegen.checks.result import ArtifactResult, CheckResult, VerifyResult
from hpcodegen.errors import (
    EXIT_USAGE,
    Finding,
    InputError,
    PlanError,
    Severity,
    UsageError,
    error,
)
from hpcodegen.targets import trusted_prefixes

#: The usage error of ``verify`` given no artifact.
NO_ARTIFACT = "no artifact to verify: name at least one artifact directory or codegen_meta.json"

#: Checks that read ``--hf-config``.
CONFIG_CHECKS: tuple[str, ...] = ("signature", "model")
#: What the runtime checks before it imports an artifact (all pure and fast).
RUNTIME_CHECKS: tuple[str, ...] = ("schema", "plan", "targets", "outputs")


def verify_artifact(path: str | os.PathLike[str], names: Sequence[str], *,
                    hf_config: Mapping[str, Any] | None = None,
                    hf_config_path: Path | None = None,
                    config_problem: Sequence[Finding] = (),
                    strict: bool = False,
                    allowed_targets: Sequence[str] = (),
                    mesh: str | None = None) -> ArtifactResult:
    """Load one artifact and run the named checks; never raises for bad input (an axis of
    ``mesh`` the plan cannot have is a :class:`UsageError`, as in ``inspect-plan``)."""
    art = ArtifactResult(str(path))
    try:
        loaded = load_meta(path)
    except InputError as exc:
        art.unreadable = True
        art.checks["load"] = CheckResult("load", "fail", list(exc.findings),
                                         reason="the meta cannot be read")
        return art
    ctx = CheckContext(loaded, dict(hf_config) if hf_config is not None else None, hf_config_path,
                       allowed_targets=tuple(allowed_targets))
    if mesh is not None:
        from hpcodegen.inspect.options import parse_mesh
        from hpcodegen.inspect.run import check_mesh_axes

        axes, ctx.live_sizes = parse_mesh(mesh)
        check_mesh_axes(ctx.plan, mesh, axes, verb="verify")
    if config_problem:
        art.unreadable = True
        for name in names:
            if name in CONFIG_CHECKS:
                art.checks[name] = CheckResult(name, "fail", list(config_problem),
                                               reason="--hf-config cannot be read")
        names = [n for n in names if n not in CONFIG_CHECKS]
    art.checks = {**run_checks(ctx, names, strict), **art.checks}
    order = [n for n in ("load", *names, *CONFIG_CHECKS) if n in art.checks]
    art.checks = {n: art.checks[n] for n in order}
    return art


def artifact_paths(paths: Sequence[str | os.PathLike[str]]) -> list[str | os.PathLike[str]]:
    """Map a generated file (``modeling_*_gen_npu.py[.diff]``, ``__init__.py``) to its
    artifact dir, so a pre-commit hook that passes changed files verifies their artifact;
    each artifact once, in the order given."""
    out: list[str | os.PathLike[str]] = []
    seen: set[str] = set()
    for path in paths:
        p = Path(path)
        if _is_file(p) and (p.name == INIT_NAME or fnmatch(p.name, MODELING_GLOB)
                            or fnmatch(p.name, MODELING_GLOB + ".diff")):
            path = p.parent
        key = os.path.abspath(Path(path).parent if Path(path).name == META_NAME else path)
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for a path the OS refuses (a name too long): loading it
    then reports why."""
    try:
        return path.is_file()
    except OSError:
        return False


def artifacts_of_changed(files: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The artifact dirs that changed files lie in (``verify --changed-files``).

    A pre-commit hook passes every changed file of the repository; a file whose directory
    holds a ``codegen_meta.json`` belongs to that artifact (an edited ``__init__.py``, a
    stray added file and a deleted one alike). Other files are ignored. Each dir once, in order.
    """
    out: list[str] = []
    for path in files:
        p = Path(path)
        try:
            folder = p if p.is_dir() else p.parent
            is_artifact = (folder / META_NAME).is_file()
        except OSError:  # a name too long: not an artifact's file
            continue
        if is_artifact and str(folder) not in out:
            out.append(str(folder))
    return out


def _usage(message: str, stderr: TextIO, stdout: TextIO | None = None,
           findings: Sequence[Finding] = ()) -> int:
    """Report a usage error on stderr; with ``--json`` also as the envelope on stdout."""
    from hpcodegen.report.envelope import emit
    from hpcodegen.report.terminal import fold_text

    stderr.write(fold_text(f"hpcodegen verify: error: {message}") + "\n")
    if stdout is not None:
        emit("verify", EXIT_USAGE, findings or [error("verify.usage", "", message)], stdout,
             ok=False, artifacts=[])
    return EXIT_USAGE


def run_verify(paths: Sequence[str | os.PathLike[str]], *,
               hf_config: str | os.PathLike[str] | None = None,
               only: Sequence[str] = (), skip: Sequence[str] = (),
               output: str = "text", junit: str | os.PathLike[str] | None = None,
               strict: bool = False, verbose: bool = False, quiet: bool = False,
               changed_files: bool = False,
               allow_target: Sequence[str] = (),
               mesh: str | None = None,
               stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Verify artifacts and report; returns the exit code (0 ok, 1 failed, 2 usage/unreadable).

    Args:
        paths: artifact directories or ``codegen_meta.json`` files, or a single one (a
            generated modeling, diff or ``__init__.py`` file stands for its artifact dir;
            duplicates run once).
        hf_config: a ``config.json`` or a model dir, for the ``signature`` and ``model`` checks.
        only / skip: check names (comma lists allowed).
        output: a :data:`hpcodegen.report.REPORTERS` name for stdout (``text`` or ``json``).
        junit: also write JUnit XML to this file (atomically).
        strict: warnings fail their check.
        verbose / quiet: text output lists info findings too / only the failing artifacts.
        changed_files: ``paths`` are changed files (a pre-commit hook's list); verify the
            artifacts they lie in (:func:`artifacts_of_changed`).
        allow_target: trusted module prefixes for injection targets (the ``targets`` check).
        mesh: live axis sizes (``"tp=4"``) the model check re-derives at instead of the
            frozen ``parallel_dims`` (needs ``hf_config``); an unknown axis is a usage error.
        stdout / stderr: where reports and usage errors go (default: the process's).

    Example::

        code = run_verify(["examples/llama_tp2"], output="json")
    """
    from hpcodegen.report import REPORTERS

    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    json_out = stdout if output == "json" else None
    if isinstance(paths, (str, os.PathLike)):  # one path, not its characters
        paths = [paths]
    if changed_files:
        paths = artifacts_of_changed(paths)
        if not paths:  # no artifact changed: a pass, silent in text
            if json_out is not None:
                from hpcodegen.report.envelope import emit

                emit("verify", 0, [], json_out, ok=True, artifacts=[])
            return 0
    try:
        names = select_checks(only, skip)
        trusted = trusted_prefixes(allow_target)
        if mesh is not None:
            from hpcodegen.inspect.options import parse_mesh

            parse_mesh(mesh)
    except UsageError as exc:
        return _usage(str(exc), stderr, json_out, exc.findings)
    if output not in REPORTERS or output == "junit":
        return _usage(f"unknown output format {output!r} (text or json)", stderr)
    if not paths:
        missing = error("verify.no_artifact", "PATH", NO_ARTIFACT,
                        hint="hpcodegen verify DIR... (every artifact under a folder: hpcodegen "
                             "verify $(find artifacts -name codegen_meta.json)); hpcodegen "
                             "verify --help")
        return _usage(missing.render(), stderr, json_out, [missing])
    junit_path = Path(junit) if junit is not None else None
    if junit_path is not None and not junit_path.parent.is_dir():
        return _usage(f"--junit: directory {junit_path.parent} does not exist", stderr,
                      json_out)
    if junit_path is not None and junit_path.is_dir():
        return _usage(f"--junit: {junit_path} is a directory (expected a file name)", stderr,
                      json_out)
    if hf_config is not None and "model" in names:
        from hpcodegen.extras import require

        try:
            require("runtime", "verify's model check (--hf-config)", ("torch", "transformers"),
                    alternative="or pass --skip model")
        except UsageError as exc:
            return _usage(str(exc), stderr, json_out, exc.findings)
    config, config_path, problem = _read_config(hf_config, names)
    result = VerifyResult(strict=strict)
    for path in artifact_paths(paths):
        try:
            result.artifacts.append(verify_artifact(path, names, hf_config=config,
                                                    hf_config_path=config_path,
                                                    config_problem=problem, strict=strict,
                                                    allowed_targets=trusted, mesh=mesh))
        except UsageError as exc:  # an axis of --mesh this plan cannot have
            return _usage(str(exc), stderr, json_out, exc.findings)
    try:
        REPORTERS[output].write(result, stdout, verbose=verbose, quiet=quiet)
        stdout.flush()
    except BrokenPipeError:  # `verify ... | head`: the JUnit file and the exit code still count
        from hpcodegen.report.terminal import reader_gone

        reader_gone()
    if junit_path is not None:
        try:
            write_atomic(junit_path, lambda s: REPORTERS["junit"].write(result, s))
        except OSError as exc:  # read-only dir, full disk: the report is out, say why not XML
            return _usage(f"--junit: cannot write {junit_path}: {exc.strerror or exc}", stderr)
    return result.exit_code


def _read_config(hf_config: str | os.PathLike[str] | None, names: Sequence[str]
                 ) -> tuple[dict[str, Any] | None, Path | None, list[Finding]]:
    if hf_config is None or not any(n in CONFIG_CHECKS for n in names):
        return None, None, []
    from hpcodegen.hf import read_hf_config

    try:
        config, path = read_hf_config(hf_config)
    except InputError as exc:
        return None, None, list(exc.findings)
    return config, path, []


def load_checked_meta(artifact_dir: str | os.PathLike[str],
                      checks: Sequence[str] = RUNTIME_CHECKS, *,
                      hf_config: Mapping[str, Any] | None = None,
                      allowed_targets: Sequence[str] = ()) -> LoadedMeta:
    """Load a meta and run ``checks`` on it, as ``verify`` would; no torch.

    Args:
        artifact_dir: the artifact directory (or its meta file).
        checks: check names; ``signature`` needs ``hf_config`` (else it is skipped).
        hf_config: the HF config as a dict (``PretrainedConfig.to_dict()``), optional.
        allowed_targets: trusted module prefixes for injection targets (the ``targets`` check).

    Returns:
        The loaded meta with its typed ``plan``, when no check reported an error (warnings
        are ignored).

    Raises:
        InputError: (exit 2) the meta cannot be read.
        UsageError: (exit 2) an unknown check name.
        PlanError: (exit 1) carrying every error finding of the checks.

    Example::

        loaded = load_checked_meta("examples/llama_tp2")
        loaded.plan.entries["lm_head"].params["weight"]["tp"]    # Shard(dim=0)
    """
    return check_meta(load_meta(artifact_dir), checks, hf_config=hf_config,
                      allowed_targets=allowed_targets)


def check_meta(loaded: LoadedMeta, checks: Sequence[str] = RUNTIME_CHECKS, *,
               hf_config: Mapping[str, Any] | None = None,
               allowed_targets: Sequence[str] = ()) -> LoadedMeta:
    """Run ``checks`` on an already loaded meta (:func:`load_checked_meta`'s second half),
    then build its typed :class:`~hpcodegen.plan.types.Plan` once (kept when ``loaded``
    has one): the runtime checks the config against the same bytes it checked first."""
    names = select_checks(checks)
    if "outputs" in names:  # the runtime imports nothing unchecked
        refuse_bare(loaded)
    trusted = trusted_prefixes(allowed_targets)
    ctx = CheckContext(loaded, dict(hf_config) if hf_config is not None else None,
                       cache=dict(loaded.memo), allowed_targets=trusted)
    results = run_checks(ctx, names)
    loaded.memo.update((k, ctx.cache[k]) for k in _OF_THE_BYTES if k in ctx.cache)
    errors = [f for r in results.values() for f in r.findings if f.severity is Severity.ERROR]
    if errors:
        raise PlanError(errors)
    if loaded.plan is not None:
        return loaded
    return replace(loaded, plan=_typed_plan(ctx))


#: The :attr:`CheckContext.cache` entries that depend on the meta's bytes alone (not on the
#: config, ``--allow-target``, ``--mesh`` nor the files beside the meta, which may change
#: between two runs): what a later :func:`check_meta` on the same loaded meta may reuse.
_OF_THE_BYTES: tuple[str, ...] = ("entry_keys", "schema", "decoded", "plan", "plan_left_out",
                                  "forms")


def refuse_bare(loaded: LoadedMeta) -> None:
    """InputError (exit 2) for a meta file given alone where an artifact must run: there is
    no checked code beside it (:func:`hpcodegen.artifact.load.is_bare_meta`)."""
    if loaded.bare:
        raise InputError([error("load.bare_meta", "", "a meta file alone is not an artifact: "
                                "there is no checked code to run",
                                expected=f"the artifact directory (or its {META_NAME})",
                                file=str(loaded.meta_path))])


def _typed_plan(ctx: CheckContext) -> Any:
    """The Plan of a checked meta, the one the checks read (built once); a shape the
    checks let through is still a clean error."""
    left_out = ctx.plan_left_out()
    if left_out:
        raise PlanError([error("plan.format", exc.where, exc.message, file=ctx.meta_file)
                         for exc in left_out])
    return ctx.plan


__all__ = ["CONFIG_CHECKS", "RUNTIME_CHECKS", "check_meta", "load_checked_meta", "refuse_bare",
           "run_verify",
           "verify_artifact"]
