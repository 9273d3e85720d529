"""``hpcodegen export``: a saved checkpoint back to an HF model directory (thin Typer verb)."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app, guarded

_HELP = """Write CHECKPOINT (saved by `hpcodegen launch --save`) as an HF model directory.

OUT gets config.json and safetensors with the original model's names and shapes, loadable
by AutoModelForCausalLM.from_pretrained. OUT must not exist (or be empty); it appears
whole or not at all.

Exit codes: 0 written; 2 not a checkpoint, unreadable input, or OUT not empty.
"""


@app.command("export", help=_HELP, no_args_is_help=True)
def export(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory (launch --save DIR)."),
    out: Path = typer.Option(..., "--out", "-o", help="HF model directory to write."),
    max_shard_size: int = typer.Option(5 * 1024**3, "--max-shard-bytes",
                                       help="Split safetensors files above this size."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
) -> None:
    def call() -> int:
        from hpcodegen.checkpoint.export import run_export
        from hpcodegen.extras import require

        require("runtime", "hpcodegen export", modules=("torch", "safetensors"))
        return run_export(checkpoint, out, max_shard_size, json_out)

    raise typer.Exit(guarded("export", call))
