"""One artifact load checks its meta once: the config check reuses the load's verdicts.

``load_verified_meta`` runs the runtime checks, then (with a config) the ``signature``
check on the same loaded bytes; every rank of every launch loads artifacts, so the schema
findings and the decoded plan are computed once and kept on the loaded object
(``LoadedMeta.memo``). These tests pin both halves of that rule: the second check run
reads the first one's verdicts, and nothing is remembered by path (a meta edited on disk
between two loads is judged afresh).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpcodegen.artifact.load import load_meta
from hpcodegen.errors import PlanError
from hpcodegen.runtime.checked import check_config, load_verified_meta

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama_tp2_sp"
CONFIG = REPO / "examples" / "configs" / "llama" / "config.json"


def test_config_check_reuses_the_loads_verdicts() -> None:
    """The load keeps its schema verdict and typed plan on the loaded object; the config
    check returns that same plan (not a second decode) and leaves the verdict as it was."""
    loaded = load_verified_meta(EXAMPLE)
    schema, plan = loaded.memo["schema"], loaded.plan
    assert schema == [] and loaded.memo["plan"] is plan
    checked = check_config(loaded, CONFIG)
    assert checked.plan is plan
    assert checked.memo["schema"] is schema


def test_nothing_is_remembered_by_path(tmp_path: Path) -> None:
    """A fresh read starts with no verdicts, so a meta edited after a clean load of the
    same path is judged afresh: the schema verdict of the clean load is not reused."""
    art = tmp_path / "art"
    shutil.copytree(EXAMPLE, art)
    load_verified_meta(art, CONFIG)
    assert load_meta(art).memo == {}
    meta_file = art / "codegen_meta.json"
    meta = json.loads(meta_file.read_text())
    meta["model_name"] = 5  # a schema error only (the field is neither signed nor hashed)
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(PlanError) as info:
        load_verified_meta(art, CONFIG)
    assert [(f.code, f.where) for f in info.value.findings] == [("schema.type", "/model_name")]
