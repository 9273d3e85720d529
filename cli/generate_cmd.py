"""``hpcodegen generate``: freeze an HF model's TP plan into an artifact (options only; logic
in :func:`hpcodegen.generate.api.run_generate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from hpcodegen.cli.app import QUIET, VERBOSE, app, guarded, start_progress, verbosity


@app.command("generate")
def generate(
    artifact: Optional[Path] = typer.Argument(
        None, metavar="[DIR]",
        help="With --check: the artifact to regenerate as its meta records (same as -o)."),
    model: Optional[Path] = typer.Option(
        None, "--model", metavar="DIR",
        help="Directory holding config.json (weights optional); with --check, default: the "
             "one the artifact records."),
    tp: Optional[int] = typer.Option(None, "--tp", metavar="N",
                                     help="Tensor-parallel degree (with --check, default: "
                                          "the artifact's)."),
    ep: Optional[int] = typer.Option(
        None, "--ep", metavar="E",
        help="Expert-parallel degree (MoE): experts sharded over E ranks carved from the "
             "data-parallel ones (E divides dp). Default 1 (with --check: the artifact's)."),
    cp: Optional[int] = typer.Option(
        None, "--cp", metavar="N",
        help="Context-parallel degree: the sequence cut over N ranks, attention K/V "
             "all-gathered (docs/cp.md). Default 1 (with --check: the artifact's)."),
    cp_layout: Optional[str] = typer.Option(
        None, "--cp-layout", metavar="LAYOUT",
        help="Which positions a cp rank holds: headtail (default for causal models: "
             "balanced) or contiguous."),
    cp_method: Optional[str] = typer.Option(
        None, "--cp-method", metavar="METHOD",
        help="How attention sees the whole sequence under cp: allgather (K/V; the default, "
             "with --check: the artifact's), ulysses (all-to-all: a head shard of the whole "
             "sequence), hybrid (--ulysses U ranks of all-to-all inside cp/U of all-gather), or "
             "auto (fewest predicted bytes)."),
    ulysses: Optional[int] = typer.Option(
        None, "--ulysses", metavar="U",
        help="The hybrid's Ulysses degree: 1 < U < cp, dividing cp."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="OUT",
                                       help="Artifact directory."),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallelism between boundaries."),
    loss_parallel: bool = typer.Option(
        False, "--loss-parallel",
        help="Keep the lm_head logits vocab-sharded (no gather); compute the loss with "
             "hpcodegen.runtime.loss.vocab_parallel_cross_entropy."),
    recipe: Optional[Path] = typer.Option(
        None, "--recipe", metavar="FILE",
        help="YAML rules (schemas/recipe.schema.json) that add or override plan entries."),
    check: bool = typer.Option(
        False, "--check",
        help="Regenerate in memory and fail on any drift from the artifact (DIR or -o); "
             "options not given are read from its meta (generator.inputs, parallel_dims)."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the JSON envelope (docs/json.md, generate.md)."),
    allow_target: list[str] = typer.Option(
        [], "--allow-target", metavar="PREFIX",
        help="Trust recipe injection targets under this module prefix (repeatable); pass "
             "the same to launch."),
    strict: bool = typer.Option(
        False, "--strict",
        help="Refuse (exit 1, nothing written) what would be a warning: a plan that splits "
             "no layer over tp."),
    pp: int = typer.Option(1, "--pp", metavar="N",
                           help="Pipeline-parallel degree: the model split into stages over N "
                                "ranks (docs/pp.md)."),
    pp_schedule: str = typer.Option(
        "1F1B", "--pp-schedule", metavar="NAME",
        help="GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble or DualPipeV."),
    microbatches: Optional[int] = typer.Option(
        None, "--microbatches", metavar="M",
        help="Microbatches per step (default: the number of stages)."),
    pp_layout: Optional[str] = typer.Option(
        None, "--pp-layout", metavar="COUNTS",
        help="Decoder layers per stage, e.g. 3,5 (default: balance parameter counts)."),
    pp_stages_per_rank: int = typer.Option(
        2, "--pp-stages-per-rank", metavar="V",
        help="Stages per rank for Interleaved1F1B (V schedules always run 2)."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """Freeze the installed transformers' TP plan (plus a recipe) into a reproducible artifact.

    The artifact is codegen_meta.json, the generated modeling module, its diff, __init__.py.
    The meta records how it was made, so `hpcodegen generate --check DIR` needs no flags.

    Exit 0: written, or up to date with --check (warnings allowed: a plan that splits no
    layer is one).

    Exit 1: the plan cannot be frozen (a rule matching nothing, an unsupported style, heads
    not divisible by N, an invalid recipe), the artifact drifted (--check), or a warning
    with --strict.

    Exit 2: usage error or an unreadable input.
    """
    def call() -> int:
        from hpcodegen.extras import require

        require("runtime", "hpcodegen generate")
        from hpcodegen.generate.api import GenerateArgs, run_generate
        from hpcodegen.generate.layouts.pipeline import PipelineArgs, parse_layout
        from hpcodegen.generate.sources.recorded import artifact_dir

        target = artifact_dir(out, artifact, check)
        pipeline = None
        if pp != 1 or pp_layout is not None or microbatches is not None:
            pipeline = PipelineArgs(pp, pp_schedule, microbatches, parse_layout(pp_layout),
                                    pp_stages_per_rank)
        return run_generate(GenerateArgs(model, tp, target, sp=sp, recipe=recipe, check=check,
                                         ep=ep,
                                         as_json=as_json, allow_target=tuple(allow_target),
                                         verbosity=verbosity(quiet, verbose),
                                         loss_parallel=loss_parallel, strict=strict,
                                         cp=cp, cp_layout=cp_layout, cp_method=cp_method,
                                         ulysses=ulysses, pipeline=pipeline))

    start_progress(quiet, as_json)
    raise typer.Exit(guarded("generate", call, as_json=as_json))
