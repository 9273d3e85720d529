"""``hpcodegen inspect-plan``: parse options, call :func:`hpcodegen.inspect.run_inspect`, exit."""

from __future__ import annotations

from typing import Optional

import typer

from .app import QUIET, VERBOSE, app, guarded, start_progress, verbosity


@app.command(
    "inspect-plan",
    help=(
        "Show what a frozen plan runs: per boundary its form and collectives (forward and "
        "backward), repeated layers folded; with --mesh, which boundaries change form on a "
        "live mesh; with --hf-config, bytes per rank from a meta-device trace.\n\n"
        "Exit codes: 0 ok, 1 the plan has errors, 2 usage error or unreadable input."
    ),
)
def inspect_plan(
    path: str = typer.Argument(..., metavar="PATH",
                               help="Artifact directory or its codegen_meta.json."),
    expand: bool = typer.Option(False, "--expand", help="One row per boundary (no folding)."),
    mesh: Optional[str] = typer.Option(
        None, "--mesh", help="Live mesh to re-validate against, e.g. tp=4,cp=2."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the JSON envelope (docs/json.md, inspect-plan.md)."),
    hf_config: Optional[str] = typer.Option(
        None, "--hf-config", help="HF config.json or model dir: adds bytes per collective."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Batch size for the volume."),
    seq: Optional[int] = typer.Option(None, "--seq", help="Sequence length for the volume."),
    dtype: str = typer.Option("bf16", "--dtype", help="Activation dtype (bf16, fp16, fp32)."),
    link_gbps: Optional[float] = typer.Option(
        None, "--link-gbps", help="Link bandwidth in Gb/s for a time estimate."),
    link_latency_us: Optional[float] = typer.Option(
        None, "--link-latency-us",
        help="Microseconds each collective adds to the time estimate (default 5)."),
    checks: bool = typer.Option(
        True, "--checks/--no-checks",
        help="Run verify's schema and plan checks first (skip for plans already verified)."),
    timeline: Optional[str] = typer.Option(
        None, "--timeline", metavar="FILE",
        help="Write the pipeline schedule as a Chrome trace (chrome://tracing, Perfetto)."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    from hpcodegen.inspect import InspectOptions, run_inspect

    start_progress(quiet, as_json)
    raise typer.Exit(guarded("inspect-plan", lambda: run_inspect(InspectOptions(
        path=path, expand=expand, mesh=mesh, as_json=as_json, hf_config=hf_config,
        batch=batch, seq=seq, dtype=dtype, link_gbps=link_gbps,
        link_latency_us=link_latency_us, checks=checks, timeline=timeline,
        verbosity=verbosity(quiet, verbose))), as_json=as_json))
