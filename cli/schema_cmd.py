"""``hpcodegen schema``: print the meta's JSON Schema (draft 2020-12) to stdout."""

from __future__ import annotations

import json
import sys

import typer
from hpcodegen.cli.app import QUIET, VERBOSE, app, guarded


@app.command("schema")
def schema(
    as_json: bool = typer.Option(
        False, "--json", help="Wrap the schema in the JSON envelope (docs/json.md) as `schema`."),
    recipe: bool = typer.Option(False, "--recipe",
                                help="Print the recipe schema (generate --recipe) instead."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """Print schemas/codegen_meta.schema.json, the published definition of codegen_meta.json
    (--recipe: schemas/recipe.schema.json). docs/schema.md shows how editors use them.

    -v also names the schema file and its $id on stderr; -q changes nothing (the schema is
    the result).

    Exit codes: 0 always.
    """

    def call() -> int:
        from importlib import resources

        from hpcodegen.checks.schema import SCHEMA_NAME

        path = resources.files("hpcodegen.schemas").joinpath(
            "recipe.schema.json" if recipe else SCHEMA_NAME)
        text = path.read_text("utf-8")
        if verbose and not quiet:
            sys.stderr.write(f"{path}\n$id {json.loads(text).get('$id')}\n")
        if as_json:
            from hpcodegen.report.envelope import emit

            return emit("schema", 0, [], sys.stdout, schema=json.loads(text))
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0

    raise typer.Exit(guarded("schema", call, as_json=as_json))
