"""The meta records how it was generated (``generator.inputs`` + ``parallel_dims``), so
``generate --check DIR`` needs no flags; a meta without the record names the flags it needs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hpcodegen.cli.app import app, register_verbs
from typer.testing import CliRunner

from hpcodegen.artifact.digest import meta_signature
from hpcodegen.errors import UsageError
from hpcodegen.generate.api import GenerateArgs
from hpcodegen.generate.sources.recorded import complete_args, generation_record

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "configs" / "llama"
FOREIGN = REPO / "tests" / "fixtures" / "artifacts" / "llama_hp"
RECIPE = '- match: "model.layers.*.self_attn"\n  injections: {inner_wrapper: sdpa_hf}\n'

register_verbs()


def _cli(*args: object, cwd: Path | None = None) -> tuple[int, str]:
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(old)
    return res.exit_code, res.output


def test_check_dir_needs_no_flags(tmp_path: Path) -> None:
    """Generated with --sp --loss-parallel and a recipe; `--check DIR` from another cwd reads
    all of it back from the meta, finds it up to date, then finds an edit."""
    models = tmp_path / "models"
    shutil.copytree(LLAMA, models / "llama")
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.parent.mkdir()
    recipe.write_text(RECIPE)
    art = tmp_path / "arts" / "llama"
    code, out = _cli("generate", "--model", models / "llama", "--tp", "2", "--sp",
                     "--loss-parallel", "--recipe", recipe, "-o", art)
    assert code == 0, out
    meta = json.loads((art / "codegen_meta.json").read_text())
    assert meta["generator"]["inputs"] == {"model_dir": "../../models/llama",
                                           "recipe": "../../recipes/r.yaml"}
    # the record is provenance: the signature is the one of the same meta without it
    bare = {**meta, "generator": {k: v for k, v in meta["generator"].items() if k != "inputs"}}
    assert meta_signature(bare) == meta["signature"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out = _cli("generate", "--check", os.path.relpath(art, elsewhere), cwd=elsewhere)
    assert code == 0 and "up to date" in out, out
    # the recorded recipe is read: an edited recipe is drift
    recipe.write_text(RECIPE + '- match: "lm_head"\n  params: {weight: {tp: "S(0)"}}\n')
    code, out = _cli("generate", "--check", art)
    assert code == 1 and "codegen_meta.json: bytes differ" in out, out
    recipe.write_text(RECIPE)
    # a flag given wins over the record
    code, out = _cli("generate", "--check", art, "--tp", "4")
    assert code == 1, out
    # the whole tree moved together: the relative record still resolves
    moved = tmp_path.parent / f"{tmp_path.name}_moved"
    shutil.copytree(tmp_path, moved)
    try:
        code, out = _cli("generate", "--check", moved / "arts" / "llama")
        assert code == 0, out
    finally:
        shutil.rmtree(moved)
    shutil.rmtree(models)
    code, out = _cli("generate", "--check", art)
    assert code == 2 and "../../models/llama" in out and "--model" in out, out


def test_check_json_says_what_it_regenerated_from() -> None:
    art = REPO / "examples" / "llama_cp2_tp2_sp"
    code, out = _cli("generate", "--check", art, "--json")
    doc = json.loads(out[out.index("{"):])
    assert code == 0 and doc["drift"] == [], out
    inputs = doc["inputs"]
    assert Path(inputs["model"]).resolve() == (REPO / "examples" / "configs" / "llama").resolve()
    assert (inputs["tp"], inputs["sp"], inputs["cp"], inputs["cp_layout"]) == (2, True, 2,
                                                                               "headtail")


def test_foreign_meta_names_the_flags_it_needs(tmp_path: Path) -> None:
    code, out = _cli("generate", "--check", FOREIGN, "--json")
    doc = json.loads(out[out.index("{"):])
    assert code == 2 and doc["status"] == "error"
    (finding,) = doc["findings"]
    assert finding["code"] == "generate.check_needs_flags"
    assert "--model DIR" in finding["hint"] and "--recipe" in finding["hint"]
    assert finding["file"].endswith("codegen_meta.json")


def test_complete_args_reads_parallel_dims(tmp_path: Path) -> None:
    """Pure: tp, sp, ep, cp, the cp layout and loss parallel come from parallel_dims; the
    model and recipe from generator.inputs, relative to the artifact dir."""
    art = tmp_path / "a"
    art.mkdir()
    (tmp_path / "cfg").mkdir()
    meta = {"generator": {"name": "hpcodegen", "version": "0",
                          "inputs": {"model_dir": "../cfg", "recipe": "../r.yaml"}},
            "parallel_dims": {"tp_size": 4, "ep_size": 2, "cp_size": 2, "cp_layout":
                              "contiguous", "sequence_parallel": True, "loss_parallel": True}}
    (art / "codegen_meta.json").write_text(json.dumps(meta))
    done = complete_args(GenerateArgs(None, None, art, check=True, ep=None, cp=None))
    assert (done.tp, done.ep, done.cp, done.cp_layout, done.sp, done.loss_parallel) == (
        4, 2, 2, "contiguous", True, True)
    assert done.model_dir == art / "../cfg" and done.recipe == art / "../r.yaml"
    given = complete_args(GenerateArgs(None, 2, art, check=True, ep=1, cp=None))
    assert (given.tp, given.ep, given.cp) == (2, 1, 2)
    # both --model and --tp given: the flags say it all (no meta read, defaults 1)
    flags = complete_args(GenerateArgs(LLAMA, 2, tmp_path / "nothing", check=True, ep=None,
                                       cp=None))
    assert (flags.ep, flags.cp, flags.sp) == (1, 1, False)
    for bad in (7, "", ["x"]):
        meta["generator"]["inputs"] = {"model_dir": bad}
        (art / "codegen_meta.json").write_text(json.dumps(meta))
        with pytest.raises(UsageError, match=r"generator\.inputs\.model_dir"):
            complete_args(GenerateArgs(None, None, art, check=True))
    with pytest.raises(UsageError, match="--model, --tp, -o"):
        complete_args(GenerateArgs(None, None, None))


def test_record_is_relative_and_hub_ids_kept(tmp_path: Path) -> None:
    assert generation_record(tmp_path / "m", None, tmp_path / "o", False) == {
        "model_dir": "../m"}
    assert generation_record("org/name", tmp_path / "r.yaml", tmp_path / "o", True) == {
        "hub_id": "org/name", "recipe": "../r.yaml"}


def test_cp_method_is_recorded_where_parallel_dims_lacks_it(tmp_path: Path) -> None:
    """--cp-method shows in the plan only as the method it resolved to: the record keeps it
    as given (the default, allgather, is not recorded: artifacts without it keep their
    bytes), and --check reads it back."""
    art = tmp_path / "ul"
    code, out = _cli("generate", "--model", LLAMA, "--tp", "2", "--cp", "2", "--cp-method",
                     "ulysses", "-o", art)
    assert code == 0, out
    inputs = json.loads((art / "codegen_meta.json").read_text())["generator"]["inputs"]
    assert inputs["cp_method"] == "ulysses" and "ulysses" not in inputs
    code, out = _cli("generate", "--check", art)
    assert code == 0 and "up to date" in out, out
    code, out = _cli("generate", "--check", art, "--cp-method", "allgather")
    assert code == 1, out
    done = complete_args(GenerateArgs(None, None, art, check=True, ep=None, cp=None,
                                      cp_method=None))
    assert (done.cp, done.cp_method, done.ulysses) == (2, "ulysses", None)
    assert complete_args(GenerateArgs(LLAMA, 2, art, cp_method=None)).cp_method == "allgather"


def test_zero_degrees_stay_usage_errors(tmp_path: Path) -> None:
    """An explicit 0 is refused, not read as 'not given' (with or without --check)."""
    code, out = _cli("generate", "--model", LLAMA, "--tp", "2", "--ep", "0", "-o", tmp_path / "o")
    assert code == 2 and "--ep must be >= 1" in out, out
    code, out = _cli("generate", "--check", REPO / "examples" / "llama_tp2", "--cp", "0")
    assert code == 2 and "--cp must be >= 1" in out, out


def test_positional_dir_is_only_for_check(tmp_path: Path) -> None:
    code, out = _cli("generate", "--model", LLAMA, "--tp", "2", tmp_path / "x")
    assert code == 2 and "positional DIR is for --check" in out, out
    code, out = _cli("generate", "--check", tmp_path / "x", "-o", tmp_path / "y")
    assert code == 2 and "name two artifacts" in out, out


@pytest.mark.parametrize("pp_flags", [
    ("--pp", "2"),
    ("--pp", "2", "--pp-schedule", "GPipe", "--microbatches", "8"),
    ("--pp", "2", "--pp-layout", "1,1"),
])
def test_check_dir_of_a_pipeline_needs_no_flags(tmp_path: Path, pp_flags: tuple[str, ...]) -> None:
    """A pipelined artifact: `--check DIR` reads the pp options back (the ``pipeline``
    section, and ``--pp-layout`` from the record), finds it up to date, and finds a
    hand-edited pipeline as drift."""
    art = tmp_path / "llama_pp"
    code, out = _cli("generate", "--model", LLAMA, "--tp", "1", *pp_flags, "-o", art)
    assert code == 0, out
    meta = json.loads((art / "codegen_meta.json").read_text())
    layout = "--pp-layout" in pp_flags
    assert ("pp_layout" in meta["generator"]["inputs"]) is layout
    code, out = _cli("generate", "--check", art)
    assert code == 0 and "up to date" in out, out
    meta["pipeline"]["n_microbatches"] += 2
    (art / "codegen_meta.json").write_text(json.dumps(meta, indent=2))
    code, out = _cli("generate", "--check", art)
    assert code == 1, out
