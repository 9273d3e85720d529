"""The ``outputs`` check: recorded files, hashes, paths that stay inside, extra files."""

from __future__ import annotations

import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402


def test_good_artifact_passes(tmp_path: Path) -> None:
    art = vf.build_fixture("qwen3_moe_g2", tmp_path / "a")
    result = vf.run_check("outputs", art)
    assert result.status == "pass" and result.findings == []


def test_bytecode_and_unrecorded_code_are_errors(tmp_path: Path) -> None:
    art = vf.build_fixture("qwen3_moe_g2", tmp_path / "a")
    (art / "__pycache__").mkdir()
    (art / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (art / "sub" / "__pycache__").mkdir(parents=True)
    (art / "helper.py").write_text("X = 1\n")
    (art / "notes.txt").write_text("hi\n")
    result = vf.run_check("outputs", art)
    assert vf.codes(result, "error") == {("outputs.unrecorded_code", "__pycache__"),
                                         ("outputs.unrecorded_code", "sub/__pycache__"),
                                         ("outputs.unrecorded_code", "helper.py")}
    assert vf.codes(result, "warning") == {("outputs.unrecorded_file", "notes.txt")}


def test_line_count_drift_names_recorded_and_actual(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    meta = vf.read_meta(art)
    meta["outputs"]["init"]["lines"] = 7
    vf.save_meta(art, meta)
    (f,) = vf.run_check("outputs", art).findings
    assert (f.code, f.where) == ("outputs.lines_drift", "/outputs/init/lines")
    assert "recorded lines 7, actual 1" in f.message and f.file.endswith("__init__.py")


def test_required_roles(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    meta = vf.read_meta(art)
    del meta["outputs"]["diff"]
    vf.save_meta(art, meta)
    result = vf.run_check("outputs", art)
    assert vf.codes(result, "error") == {("outputs.missing_role", "/outputs/diff")}
    assert vf.codes(result, "warning") == {
        ("outputs.unrecorded_file", "modeling_Llama_gen_npu.py.diff")}


def test_role_without_a_modeling_file(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    (art / vf.modeling_name(art)).unlink()
    assert vf.codes(vf.run_check("outputs", art), "error") == {
        ("outputs.no_modeling_file", "/outputs/modeling"),
        ("outputs.no_modeling_file", "/outputs/diff"),
    }


def test_directory_recorded_as_a_file(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    (art / "sub").mkdir()
    meta = vf.read_meta(art)
    meta["outputs"]["sub"] = {"sha256": "0" * 64, "lines": 0}
    vf.save_meta(art, meta)
    assert vf.codes(vf.run_check("outputs", art), "error") == {
        ("outputs.not_a_file", "/outputs/sub")}


def test_link_inside_the_dir_is_fine(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    (art / "alias.py").symlink_to(art / "__init__.py")
    vf.rewrite_file(art, "alias.py", (art / "__init__.py").read_text())
    assert vf.run_check("outputs", art).status == "pass"


def test_remote_siblings_must_be_recorded(tmp_path: Path) -> None:
    art = vf.build_fixture("qwen3_moe_g3", tmp_path / "a")
    meta = vf.read_meta(art)
    meta["remote_siblings"] = ["configuration_qwen3_moe.py"]
    vf.save_meta(art, meta)
    assert vf.codes(vf.run_check("outputs", art), "error") == {
        ("outputs.sibling_unrecorded", "/remote_siblings/0")}


def test_foreign_signatures_are_not_recomputed(tmp_path: Path) -> None:
    art = vf.build_fixture("qwen3_moe_g3", tmp_path / "a")
    meta = vf.read_meta(art)
    meta["param_plan"]["lm_head"]["params"]["weight"]["tp"] = "S(1)"
    vf.save_meta(art, meta)
    assert vf.run_check("outputs", art).status == "pass"


def test_link_cycle_is_listed_not_followed(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    (art / "loop").symlink_to(art, target_is_directory=True)
    result = vf.run_check("outputs", art)
    assert vf.codes(result) == {("outputs.unrecorded_file", "loop")}
