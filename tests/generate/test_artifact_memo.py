"""The suite's shared builds (:mod:`artifact_memo`) answer what the real build and the real
``generate`` answer, and no caller can change what the next one gets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import artifact_memo
import pytest

from hpcodegen.errors import UsageError
from hpcodegen.generate import api
from hpcodegen.hf import read_hf_config

pytestmark = pytest.mark.slow

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
GPT2 = FAMILIES / "gpt2"
PHI3 = FAMILIES / "phi3"  # generates with --sp


@pytest.fixture
def fresh_memo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty memo: nothing kept in this process, a run directory of its own."""
    monkeypatch.setattr(artifact_memo, "_BUILT", {})
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv(artifact_memo.DIR_ENV, str(run))
    return run


def _answers(count: int) -> list[str]:
    return artifact_memo.answers[len(artifact_memo.answers) - count:]


def test_a_shared_build_equals_its_own_and_is_a_fresh_copy_each_time(fresh_memo: Path
                                                                     ) -> None:
    config, _ = read_hf_config(GPT2)
    first_notes: list[str] = []
    first = artifact_memo.build_bundle(config, 2, False, None, "gpt2", notes=first_notes)
    first["codegen_meta.json"] = b"{}"  # a caller's edit stays its own
    again_notes: list[str] = []
    # the defaults named or left out: one build
    again = artifact_memo.build_bundle(config, 2, False, None, "gpt2", notes=again_notes, ep=1,
                                       cp_method="allgather")
    assert _answers(2) == ["built", "process"]
    own_notes: list[str] = []
    own = api.build_bundle(config, 2, False, None, "gpt2", notes=own_notes)
    assert again == own and again_notes == first_notes == own_notes
    assert json.loads(again["codegen_meta.json"])["param_plan"]
    artifact_memo.build_bundle(config, 2, False, None, "gpt2_other_label")
    assert _answers(1) == ["built"]  # the label is in the bytes (the banner): its own build


def test_a_build_kept_by_another_worker_is_read_from_the_run_directory(
        fresh_memo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its warnings too (BLOOM's slow_but_exact splits no layer: generate warns)."""
    config, _ = read_hf_config(FAMILIES / "bloom")
    config.update(slow_but_exact=True, pretraining_tp=2)
    warned: list = []
    built = artifact_memo.build_bundle(config, 2, False, None, "bloom", warnings=warned)
    assert len(list(fresh_memo.glob("*.pickle"))) == 1
    monkeypatch.setattr(artifact_memo, "_BUILT", {})  # another process: nothing in memory
    warned_again: list = []
    read = artifact_memo.build_bundle(config, 2, False, None, "bloom", warnings=warned_again)
    assert _answers(2) == ["built", "run"]
    assert read == built and warned_again == warned
    assert [w.code for w in warned] == ["generate.no_layer_split"]


def test_a_refused_build_is_not_kept(fresh_memo: Path) -> None:
    config, _ = read_hf_config(GPT2)
    for _ in range(2):
        with pytest.raises(UsageError, match="--tp"):
            artifact_memo.build_bundle(config, 0, False, None, "gpt2")
    assert _answers(2) == ["built", "built"]  # each refusal is the call's own
    assert artifact_memo._BUILT == {} and not list(fresh_memo.iterdir())


def test_generate_writes_what_the_cli_writes_in_a_fresh_directory(fresh_memo: Path,
                                                                  tmp_path: Path) -> None:
    model = tmp_path / "phi3"
    shutil.copytree(PHI3, model)
    cli = tmp_path / "cli" / "art"
    assert api.generate_artifact(api.GenerateArgs(model, 2, cli, sp=True, ep=1)) == 0
    first = artifact_memo.generate(model, tmp_path / "a" / "art", 2, sp=True)
    again = artifact_memo.generate(model, tmp_path / "b" / "art", 2, sp=True, ep=1)
    assert _answers(2) == ["built", "process"]  # out sits alike: one build
    (first / "codegen_meta.json").write_text("{}")  # a test's edit of its own copy
    for name in sorted(p.name for p in cli.iterdir()):
        assert (again / name).read_bytes() == (cli / name).read_bytes(), name
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in cli.iterdir())
    assert json.loads((again / "codegen_meta.json").read_text())["generator"]["inputs"] == {
        "model_dir": "../../phi3"}
