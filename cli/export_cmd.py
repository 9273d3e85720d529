"""``hpcodegen export``: a saved checkpoint back to an HF model directory (options only;
logic in :func:`hpcodegen.checkpoint.export.run_export`)."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import QUIET, VERBOSE, app, guarded, verbosity


@app.command("export")
def export(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory (launch --save DIR)."),
    out: Path = typer.Option(..., "--out", "-o", metavar="OUT",
                             help="HF model directory to write (new or empty)."),
    max_shard_bytes: int = typer.Option(5 * 1024**3, "--max-shard-bytes", metavar="N",
                                        help="Split safetensors files above this size."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the JSON envelope (docs/json.md, checkpoints.md)."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """Write CHECKPOINT (saved by `hpcodegen launch --save`) as an HF model directory.

    OUT gets config.json and safetensors with the original model's names and shapes,
    loadable by AutoModelForCausalLM.from_pretrained. It appears whole or not at all.

    Exit 0: written.

    Exit 2: not a checkpoint, unreadable input, or OUT exists and is not empty.
    """
    def call() -> int:
        from hpcodegen.extras import require

        require("runtime", "hpcodegen export", modules=("torch", "safetensors"))
        from hpcodegen.checkpoint.export import run_export

        return run_export(checkpoint, out, max_shard_bytes, as_json=as_json,
                          verbosity=verbosity(quiet, verbose))

    raise typer.Exit(guarded("export", call, as_json=as_json))
