"""``hpcodegen verify``: the CI gate for codegen artifacts (options only; logic in
:func:`hpcodegen.verify.run_verify`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from hpcodegen.cli.app import app, guarded, start_progress

_CHECKS_HELP = ("schema, plan, targets, outputs, source, signature, model (comma lists allowed; "
                "repeatable)")


_HELP = (
    "Check codegen artifacts: schema, plan semantics, file hashes, generated source, and (with "
    "--hf-config) the model they were made for.\n\n"
    "Exit codes: 0 every check passed (warnings allowed), 1 a check failed (or a warning with "
    "--strict), 2 usage error or an unreadable input."
)


@app.command("verify", help=_HELP)
def verify(
    paths: Optional[list[Path]] = typer.Argument(
        None, metavar="PATH...", show_default=False,
        help="Artifact directories or codegen_meta.json files (at least one)."),
    hf_config: Optional[Path] = typer.Option(
        None, "--hf-config", metavar="PATH",
        help="HF config.json or model dir: enables the signature and model checks."),
    only: list[str] = typer.Option([], "--only", metavar="NAME", help=f"Run only: {_CHECKS_HELP}."),
    skip: list[str] = typer.Option([], "--skip", metavar="NAME", help=f"Skip: {_CHECKS_HELP}."),
    json_out: bool = typer.Option(False, "--json",
                                  help="Print the JSON envelope (docs/json.md)."),
    junit: Optional[Path] = typer.Option(None, "--junit", metavar="FILE",
                                         help="Also write JUnit XML to FILE (atomically)."),
    strict: bool = typer.Option(False, "--strict", help="Warnings fail their check."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="List info findings too."),
    quiet: bool = typer.Option(False, "--quiet", "-q",
                               help="List only failing artifacts (nothing when all pass)."),
    changed_files: bool = typer.Option(
        False, "--changed-files",
        help="PATHs are changed files (pre-commit): verify the artifact dir each lies in."),
    mesh: Optional[str] = typer.Option(
        None, "--mesh", metavar="AXIS=N,...",
        help="Re-derive the plan at these axis sizes, e.g. tp=4 (the model check; needs "
             "--hf-config). An axis of size 1 moves nothing and is no error."),
    allow_target: list[str] = typer.Option(
        [], "--allow-target", metavar="PREFIX",
        help="Trust injection targets under this module prefix (repeatable); others must be "
             "registered (entry point group hpcodegen.injection_targets)."),
) -> None:
    """Parse the options and hand them to :func:`hpcodegen.verify.run_verify`."""
    from hpcodegen.verify import run_verify

    start_progress(quiet, json_out)
    raise typer.Exit(guarded("verify", lambda: run_verify(
        paths or [], hf_config=hf_config, only=only, skip=skip,
        output="json" if json_out else "text", junit=junit, strict=strict,
        verbose=verbose and not quiet, quiet=quiet, allow_target=allow_target,
        changed_files=changed_files, mesh=mesh), as_json=json_out))
