"""``hpcodegen schema``: print the meta's JSON Schema (draft 2020-12) to stdout."""

from __future__ import annotations

import sys

from hpcodegen.cli.app import app


@app.command("schema")
def schema() -> None:
    """Print schemas/codegen_meta.schema.json, the published definition of codegen_meta.json.

    Exit codes: 0 always.
    """
    from hpcodegen.checks.schema import schema_text

    text = schema_text()
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
