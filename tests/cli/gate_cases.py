"""What the gate's hostile-plan tests share: the CLI in-process with ``--json``, and one
artifact per tiny family config generated under a folder."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cli_json(*args: Any) -> tuple[int, dict]:
    """``hpcodegen ARGS... --json`` in this process: (exit code, the JSON envelope)."""
    from hpcodegen.cli.app import app, register_verbs
    from typer.testing import CliRunner

    register_verbs()
    res = CliRunner().invoke(app, [*map(str, args), "--json"], catch_exceptions=False)
    return res.exit_code, json.loads(res.stdout)


def generate_families(root: Path, families: Mapping[str, tuple[Any, ...]],
                      made: dict[str, tuple[Path, Path]] | None = None
                      ) -> dict[str, tuple[Path, Path]]:
    """``{name: (config dir, artifact dir)}`` for ``{name: (model_type, class, flags)}``,
    each generated from ``hpcodegen.families.tiny``'s config of that family; an optional
    fourth item is a dict of config fields set over it (DeepSeek's tiny config has only
    dense layers: ``first_k_dense_replace`` 0 makes every layer an MoE one).

    ``made`` (``conftest.family_artifacts``'s memo) keeps what was generated, by config
    and flags, for the next module that asks for the same one: generation is most of a
    module's setup, and the artifacts are only read (each edit is made on a copy)."""
    from hpcodegen.families.tiny import tiny_config

    made = {} if made is None else made
    out = {}
    for name, (model_type, cls, flags, *fields) in families.items():
        config = {**tiny_config(model_type, cls), **(fields[0] if fields else {})}
        key = json.dumps([config, [str(f) for f in flags]], sort_keys=True)
        if key not in made:
            cfg = root / f"cfg_{name}"
            cfg.mkdir()
            (cfg / "config.json").write_text(json.dumps(config))
            art = root / f"art_{name}"
            code, doc = cli_json("generate", "--model", cfg, *flags, "-o", art)
            assert code == 0, (name, doc)
            made[key] = (cfg, art)
        out[name] = made[key]
    return out
