"""A launch rank reads its artifact once, through ``Artifact.load``, and lays its mesh out
from the plan that passed the checks: an artifact whose checks fail stops the rank before
any mesh is built; the model it builds comes from that same checked artifact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpcodegen.errors import PlanError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama_tp2"
CONFIG = REPO / "examples" / "configs" / "llama"


def test_the_rank_mesh_comes_from_the_checked_artifact(fake_world) -> None:
    from hpcodegen.launch.rank.artifact import checked_artifact, rank_artifact
    from hpcodegen.launch.rank.context import init_rank

    fake_world(4)
    ctx = init_rank(EXAMPLE, device="cpu")
    art = rank_artifact(EXAMPLE)
    assert ctx.meta is art.loaded and ctx.meta.plan is art.plan
    assert ctx.layout.names == ("dp", "tp") and ctx.layout.sizes == (2, 2)
    config = json.loads((CONFIG / "config.json").read_text())
    checked = checked_artifact(EXAMPLE, config)
    assert checked.plan is art.plan and checked.module() is art.module()


def test_a_rank_refuses_an_artifact_that_fails_its_checks_before_the_mesh(
        fake_world, tmp_path) -> None:
    """A plan edited by hand without re-signing: the rank used to lay its mesh out from it
    unchecked; now ``Artifact.load`` refuses it first."""
    from hpcodegen.launch.rank.context import init_rank

    art = tmp_path / "art"
    shutil.copytree(EXAMPLE, art, ignore=shutil.ignore_patterns("__pycache__"))
    meta_path = art / "codegen_meta.json"
    meta = json.loads(meta_path.read_text())
    meta["parallel_dims"]["tp_size"] = 4
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True))
    fake_world(4)
    with pytest.raises(PlanError) as info:
        init_rank(art, device="cpu")
    assert {f.code for f in info.value.findings} == {"outputs.signature_drift"}, info.value
