"""verify's model check, run once by the launcher in a child process before any rank starts.

The model check (:mod:`hpcodegen.checks.model`: the plan's forward and backward derived on a
fake process group, every declared placement compared with the derived one) needs torch and
takes seconds; the launcher parent stays torch-free so its own refusals stay instant. So
the parent runs ``hpcodegen verify ARTIFACT --only model --hf-config CONFIG --json`` as a
child, reads its findings from the JSON envelope, and refuses the launch (exit 1, the
findings shown, no rank started) when it fails. The ranks never repeat it.

``--timeout`` is one deadline: the child gets what is left of it, and a child that runs
past it is killed and reported as ``launch.timeout`` (the job then never starts).

A pass is recorded in the verdict cache (:mod:`hpcodegen.launch.launcher.check_cache`)
under the digest of every input it depends on; :func:`cached_model_check` returns it for
a later launch of the same bytes, which then starts no child.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcodegen.errors import (
    EXIT_FAILED,
    EXIT_OK,
    Finding,
    HpcodegenError,
    InputError,
    PlanError,
    Severity,
    error,
    printable,
)
from hpcodegen.launch.launcher.deadline import PreStartTimeout


def model_check_argv(artifact: Path, config_path: Path,
                     allow_target: Sequence[str] = ()) -> list[str]:
    """The child's command line: verify's ``model`` check alone, as JSON."""
    argv = [sys.executable, "-m", "hpcodegen", "verify", str(artifact), "--only", "model",
            "--hf-config", str(config_path), "--json"]
    for prefix in allow_target:
        argv += ["--allow-target", prefix]
    return argv


def _cache_inputs(artifact: Path, config_path: Path,
                  allow_target: Sequence[str]) -> dict[str, Any] | None:
    """The verdict cache's key material; None when an input cannot be read (no caching)."""
    from hpcodegen.artifact.load import resolve_meta_path
    from hpcodegen.launch.launcher.check_cache import verdict_inputs

    try:
        return verdict_inputs(resolve_meta_path(artifact), Path(config_path), allow_target)
    except (OSError, HpcodegenError):
        return None


def cached_model_check(artifact: Path, config_path: Path, allow_target: Sequence[str] = (),
                       cache: Path | None = None) -> list[Finding] | None:
    """The warnings of a recorded pass for exactly these inputs; None when there is none
    (or ``cache`` is None): the check must run."""
    if cache is None:
        return None
    from hpcodegen.launch.launcher.check_cache import load_verdict

    inputs = _cache_inputs(artifact, config_path, allow_target)
    recorded = load_verdict(cache, inputs) if inputs is not None else None
    return _parse(recorded) if recorded is not None else None


def run_model_check(artifact: Path, config_path: Path, allow_target: Sequence[str] = (),
                    timeout: float | None = None, cache: Path | None = None) -> list[Finding]:
    """Run the model check in a child; its warnings when it passes (recorded in ``cache``,
    a directory, when one is given).

    Raises :class:`PlanError` (exit 1) with the child's findings when the check fails,
    :class:`PreStartTimeout` when it runs past ``timeout`` seconds (the child is killed),
    :class:`InputError` (exit 2) when the child's report is unusable or says the input is.
    """
    argv = model_check_argv(artifact, config_path, allow_target)
    # the key of the bytes as they were before the child read them
    before = _cache_inputs(artifact, config_path, allow_target) if cache is not None else None
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:  # subprocess.run killed and reaped the child
        raise PreStartTimeout([error(
            "launch.timeout", "--timeout",
            f"the model check before any rank starts ran past --timeout ({timeout:.3g} s "
            "left for it); nothing was started",
            hint="a larger --timeout, or check the artifact first: hpcodegen verify "
                 f"{artifact} --hf-config {config_path}")]) from None
    findings = _findings(proc.stdout)
    if proc.returncode == EXIT_OK and findings is not None:
        warnings = [f for f in findings if f.severity is not Severity.INFO]
        # recorded only when no input changed while the child ran (it judged these bytes)
        if cache is not None and before is not None \
                and _cache_inputs(artifact, config_path, allow_target) == before:
            from hpcodegen.launch.launcher.check_cache import store_verdict

            store_verdict(cache, before, [f.to_json() for f in warnings])
        return warnings
    if proc.returncode == EXIT_FAILED and findings:
        raise PlanError([f for f in findings if f.severity is not Severity.INFO])
    if findings:  # exit 2: the config or the artifact is unreadable for the check
        raise InputError([f for f in findings if f.severity is not Severity.INFO] or findings)
    tail = " | ".join(proc.stderr.decode(errors="replace").strip().splitlines()[-3:])
    raise InputError([error("launch.model_check", str(artifact),
                            f"the model check (hpcodegen verify --only model) exited "
                            f"{proc.returncode} without a report: {printable(tail)[:400]}",
                            hint=f"run it yourself: hpcodegen verify {artifact} --only model "
                                 f"--hf-config {config_path}")])


def _findings(stdout: bytes) -> list[Finding] | None:
    """The envelope's findings as :class:`Finding` objects; None when it cannot be read."""
    try:
        doc: Any = json.loads(stdout)
    except ValueError:
        return None
    return _parse(doc.get("findings") if isinstance(doc, dict) else None)


def _parse(raw: Any) -> list[Finding] | None:
    """Findings in the envelope's JSON shape as :class:`Finding` objects; None when
    ``raw`` is not such a list."""
    try:
        return [Finding(code=str(f["code"]), severity=Severity(f["severity"]),
                        where=str(f.get("path") or ""), message=str(f["message"]),
                        expected=f.get("expected"), hint=f.get("hint"), file=f.get("file"))
                for f in raw]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
