"""What the gate's hostile-plan tests share: the CLI in-process with ``--json``, and one
artifact per tiny family config generated under a folder."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def cli_json(*args: Any) -> tuple[int, dict]:
    """``hpcodegen ARGS... --json`` in this process: (exit code, the JSON envelope)."""
    from hpcodegen.cli.app import app, register_verbs
    from typer.testing import CliRunner

    register_verbs()
    res = CliRunner().invoke(app, [*map(str, args), "--json"], catch_exceptions=False)
    return res.exit_code, json.loads(res.stdout)


def generate_families(root: Path, families: Mapping[str, tuple[Any, ...]]
                      ) -> dict[str, tuple[Path, Path]]:
    """``{name: (config dir, artifact dir)}`` for ``{name: (model_type, class, flags)}``,
    each generated under ``root`` from ``hpcodegen.families.tiny``'s config of that family;
    an optional fourth item is a dict of config fields set over it (DeepSeek's tiny config
    has only dense layers: ``first_k_dense_replace`` 0 makes every layer an MoE one).

    The bytes are ``generate --model cfg_NAME FLAGS -o art_NAME``'s; the build is paid once
    per run (:func:`artifact_memo.generate`): generation is most of a module's setup, and
    both gate modules ask for some of the same (config, flags)."""
    from artifact_memo import generate

    from hpcodegen.families.tiny import tiny_config

    out = {}
    for name, (model_type, cls, flags, *fields) in families.items():
        cfg = root / f"cfg_{name}"
        cfg.mkdir()
        (cfg / "config.json").write_text(json.dumps(
            {**tiny_config(model_type, cls), **(fields[0] if fields else {})}))
        out[name] = cfg, generate(cfg, root / f"art_{name}", **_options(flags))
    return out


def _options(flags: Sequence[Any]) -> dict[str, Any]:
    """generate's flags (``--tp N``, ``--ep N``, ``--sp``) as its arguments' names."""
    args = [str(f) for f in flags]
    options: dict[str, Any] = {}
    while args:
        flag = args.pop(0)
        if flag == "--sp":
            options["sp"] = True
        elif flag in ("--tp", "--ep"):
            options[flag[2:]] = int(args.pop(0))
        else:
            raise ValueError(f"gate_cases: generate flag {flag} is not one of --tp --ep --sp")
    return options
