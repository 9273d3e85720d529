"""Phase 1 of the coverage measure: one family through the CLI as a user runs it.

``generate`` at tp 2, tp 4 (with 4 kv heads) and tp 2 ``--sp``, ``verify --hf-config``
on each, ``inspect-plan`` on the tp 2 artifact, in this process (typer's runner), each
outcome with the first finding of a failure.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcodegen.families.catalog import family_kind, hf_styles, is_moe
from hpcodegen.families.tiny import ALIASES, tiny_config
from hpcodegen.plan.codec import plan_from_meta
from hpcodegen.plan.types import Plan

RULES = Path(__file__).resolve().parents[1] / "generate" / "rules"


def _cli(args: Sequence[str]) -> tuple[int, str]:
    from typer.testing import CliRunner

    from hpcodegen.cli.app import app, register_verbs

    register_verbs()  # the verbs, as the console script registers them
    # one line per finding (no folding at a terminal width): reasons are read from it
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "4000"})
    text = (result.stdout or "") + (getattr(result, "stderr", "") or "")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text += f"\n{type(result.exception).__name__}: {result.exception}"
    return result.exit_code, text


def _reason(text: str, work: Path | None = None) -> str:
    """The first finding of a CLI failure, on one line, without the verb prefix; paths
    under ``work`` (a temporary directory) named from it (``llama4/config/config.json``), so
    a report does not change with the run's directory."""
    if work is not None:
        text = text.replace(f"{work}/", "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("hpcodegen ") or re.search(r"\berror\b", ln):
            joined = " ".join(lines[i:i + 4])
            joined = re.sub(r"^hpcodegen \w[\w-]*: ", "", joined)
            return re.split(r" (?=hpcodegen \w[\w-]*: )", joined)[0][:300]
    return (lines[-1] if lines else "no output")[:300]


def layers_split(plan: Plan, model: Any) -> bool:
    """Some parameter inside one of ``model``'s layers is sharded on tp: generate's own rule
    (:func:`hpcodegen.generate.checks.layer_split.splits_a_layer`), on the meta model."""
    from hpcodegen.generate.checks.layer_split import layer_blocks, splits_a_layer

    return splits_a_layer(layer_blocks(model), plan.entries or {})


def check_family(model_type: str, class_name: str, work: Path,
                 repo: Path | None = None) -> dict[str, Any]:
    """Phase 1 of one family: config, generate x3, verify x3, inspect (see the docstring).

    ``repo``: a source checkout whose ``tests/fixtures/families`` configs stand in where a
    family's defaults do not shrink.
    """
    row: dict[str, Any] = {"family": model_type, "class": class_name,
                           "kind": family_kind(model_type)}
    cfg_dir = work / model_type / "config"
    try:
        try:
            config = tiny_config(model_type, class_name)
        except Exception:
            # defaults that do not shrink (GPT-Neo's attention_types must match its layer
            # count): the hand-made tiny config of the tests, when there is one
            if repo is None:
                raise
            fixture = repo / "tests" / "fixtures" / "families" / model_type / "config.json"
            if not fixture.is_file():
                raise
            config = json.loads(fixture.read_text())
            row["config_from"] = str(fixture.relative_to(repo))
        row["moe"] = is_moe(config, hf_styles(config))
        row["hf_plan"] = bool(hf_styles(config))
    except Exception as exc:
        row.update(moe=False, hf_plan=False, config_error=f"{type(exc).__name__}: {exc}"[:300])
        return row
    cfg_dir.mkdir(parents=True, exist_ok=True)
    (cfg_dir / "config.json").write_text(json.dumps(config, indent=1, default=str))
    cfg4_dir = work / model_type / "config_kv4"  # tp 4 needs 4 kv heads
    cfg4_dir.mkdir(parents=True, exist_ok=True)
    def kv4(scope: Mapping[str, Any]) -> dict[str, Any]:
        return {k: 4 for k in ("num_key_value_heads", *ALIASES["num_key_value_heads"])
                if isinstance(scope.get(k), int) and not isinstance(scope.get(k), bool)}

    config4 = {**config, **kv4(config)}
    for name, sub in config.items():  # text_config, BLT's encoder/global/decoder/patcher
        if isinstance(sub, Mapping) and kv4(sub):
            config4[name] = {**sub, **kv4(sub)}
    (cfg4_dir / "config.json").write_text(json.dumps(config4, indent=1, default=str))
    model: Any = None
    for variant, extra in (("tp2", ["--tp", "2"]), ("tp4", ["--tp", "4"]),
                           ("sp", ["--tp", "2", "--sp"]), ("cp2", ["--tp", "1", "--cp", "2"])):
        out = work / model_type / variant
        cfg = cfg4_dir if variant == "tp4" else cfg_dir
        code, text = _cli(["generate", "--model", str(cfg), *extra, "-o", str(out)])
        if code != 0:
            reason = _reason(text, work)
            if "transformers cannot build" in reason:
                reason = default_build_error(model_type, class_name) or reason
            row[variant] = {"ok": False, "stage": "generate", "reason": reason}
            continue
        # generate's note naming the file (a warning may mention package rules in a hint);
        # also a model_type reusing a family's rules
        packaged = "\npackage rules " in f"\n{text}"
        seeded = "\nstructural seeds" in f"\n{text}"
        code, text = _cli(["verify", str(out), "--hf-config", str(cfg)])
        if code != 0:
            row[variant] = {"ok": False, "stage": "verify", "reason": _reason(text, work)}
            continue
        plan = plan_from_meta(json.loads((out / "codegen_meta.json").read_text()))
        if model is None:  # the structure is the same at every variant: built once
            from hpcodegen.hf import build_meta_model

            model = build_meta_model(config)
        row[variant] = {"ok": True, "dir": str(out), "split": layers_split(plan, model),
                        "package": packaged or uses_package_rules(model_type),
                        "seeded": seeded}
        if variant == "tp2":
            code, text = _cli(["inspect-plan", str(out)])
            if code != 0:
                row[variant] = {"ok": False, "stage": "inspect-plan", "reason": _reason(text, work)}
    return row


def default_build_error(model_type: str, class_name: str) -> str | None:
    """Why ``class_name`` cannot be built even from transformers' own default config (on
    the meta device), or None when it can: the failure is then not the tiny config's."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = getattr(transformers, class_name, None)
    config_cls = getattr(cls, "config_class", None) or CONFIG_MAPPING[model_type]
    try:
        with torch.device("meta"):
            cls(config_cls())
    except Exception as exc:
        return (f"transformers' default {config_cls.__name__} cannot build {class_name}: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())}")[:300]
    return None


def uses_package_rules(model_type: str) -> bool:
    return (RULES / f"{model_type}.yaml").is_file()


def phase1_worker(families: Sequence[tuple[str, str]], work: Path, out: Path,
                  repo: Path | None = None) -> None:
    """Phase 1 of each family, the rows written to ``out`` after each (a worker that dies
    keeps what it did)."""
    import warnings

    warnings.filterwarnings("ignore")
    rows = []
    for model_type, cls in families:
        start = time.perf_counter()
        try:
            row = check_family(model_type, cls, work, repo)
        except Exception as exc:
            row = {"family": model_type, "class": cls, "moe": False,
                   "config_error": f"{type(exc).__name__}: {exc}"[:300]}
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        out.write_text(json.dumps(rows))
