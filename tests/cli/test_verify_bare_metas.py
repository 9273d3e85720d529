"""``verify FILE.json``: a meta file alone, as the existing system's metas are shared
(issue 34). The folder around it is never read: a neighbouring virtualenv full of ``.py``
files, or nothing at all, changes no verdict. The file checks are skipped (saying why);
schema, plan, targets (and signature, model with ``--hf-config``) give the verdicts they
give for the same meta inside its bundle. ``verify DIR`` stays the artifact check, the
runtime refuses a bare meta, and inspect-plan reads one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import inproc
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import bundle_fixtures as bf  # noqa: E402
import verify_fixtures as vf  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = FIXTURES / "artifacts"
#: every real meta of the existing system kept here, both naming generations, with the
#: config each was made for
REAL = {**{name: FIXTURES / "configs" / bf.CONFIG_DIR for name in bf.BUNDLES},
        **{name: FIXTURES / "configs" / cfg for name, cfg in vf.CONFIG_OF.items()}}
FILE_CHECKS = ("outputs", "source")

pytestmark = pytest.mark.timeout(400)


def verify(*args: str | Path) -> tuple[int, dict[str, Any]]:
    """The CLI's verdict, run in this process (:mod:`inproc`: the model check's torch and
    transformers are imported once, not per run)."""
    allow = [a for p in vf.REFERENCE_TARGETS for a in ("--allow-target", p)]
    proc = inproc.run("verify", *args, *allow, "--json", cwd=REPO)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _crowded_folder(root: Path) -> Path:
    """A download folder: a virtualenv's worth of code, a setup.py, a stray modeling file
    of another artifact's name pattern; each real meta copied in under its shared name."""
    site = root / ".venv" / "lib" / "python3.11" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    for i in range(200):
        (site / f"m{i}.py").write_text("x = 1\n")
    (root / "setup.py").write_text("print('never run')\n")
    (root / "modeling_other_gen_npu.py").write_text("class Foo: pass\n")
    for name in REAL:
        shutil.copy(ARTIFACTS / name / "codegen_meta.json", root / f"{name}.json")
    return root


def _no_file_findings(artifact: dict[str, Any]) -> None:
    for name in FILE_CHECKS:
        check = artifact["checks"][name]
        assert check["status"] == "skipped" and "alone" in check["reason"], check
    every = [f for c in artifact["checks"].values() for f in c["findings"]]
    assert not [f for f in every if f["code"].startswith(("outputs.", "source."))]


def _verdicts(artifact: dict[str, Any]) -> dict[str, tuple[str, list[tuple[str, str, str]]]]:
    return {name: (c["status"], sorted((f["code"], f["severity"], f["path"])
                                       for f in c["findings"]))
            for name, c in artifact["checks"].items() if name not in FILE_CHECKS}


@pytest.mark.parametrize("strict", [False, True])
def test_real_metas_pass_as_bare_files_in_a_crowded_folder(tmp_path, strict) -> None:
    folder = _crowded_folder(tmp_path)
    files = [folder / f"{name}.json" for name in REAL]
    code, doc = verify(*files, *(["--strict"] if strict else []))
    assert code == 0, json.dumps(doc, indent=1)[:3000]
    assert [a["path"] for a in doc["artifacts"]] == [str(f) for f in files]
    for artifact in doc["artifacts"]:
        assert artifact["ok"]
        _no_file_findings(artifact)


# two model checks per real config, in-process: 27 s on a quiet machine, past 400 s at load 20
@pytest.mark.timeout(900)
def test_bare_verdicts_equal_the_bundle_verdicts_with_hf_config(tmp_path) -> None:
    """Per config: each meta as a file alone and as its bundle, --strict, signature and
    model included; identical verdicts but for the two file checks."""
    folder = _crowded_folder(tmp_path)
    for config in sorted(set(REAL.values())):
        names = [n for n, c in REAL.items() if c == config]
        bare_code, bare = verify(*(folder / f"{n}.json" for n in names), "--hf-config",
                                 config, "--strict")
        dir_code, bundles = verify(*(ARTIFACTS / n for n in names), "--hf-config", config,
                                   "--strict")
        assert bare_code == dir_code == 0, json.dumps(bare, indent=1)[:3000]
        for b, d in zip(bare["artifacts"], bundles["artifacts"], strict=True):
            _no_file_findings(b)
            assert {d["checks"][n]["status"] for n in FILE_CHECKS} == {"pass"}
            assert _verdicts(b) == _verdicts(d)
            assert b["checks"]["signature"]["status"] == "pass"
            assert b["checks"]["model"]["status"] == "pass"


def test_a_meta_alone_in_its_own_folder_is_not_an_artifact_missing_files(tmp_path) -> None:
    for name in ("g2_qwen3_moe.json", "codegen_meta.json"):
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        shutil.copy(ARTIFACTS / "qwen3_moe_g2" / "codegen_meta.json", folder / name)
        code, doc = verify(folder / name)
        assert code == 0, doc
        _no_file_findings(doc["artifacts"][0])


def test_a_broken_bare_meta_still_fails_its_own_checks(tmp_path) -> None:
    meta = json.loads((ARTIFACTS / "qwen3_moe_g2" / "codegen_meta.json").read_text())
    meta["param_plan"]["lm_head"]["params"]["weight"]["tp"] = "S(7)"
    meta["mesh_dim_names"] = "tp"
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(meta))
    code, doc = verify(path)
    assert code == 1
    art = doc["artifacts"][0]
    assert art["checks"]["schema"]["status"] == "fail"
    _no_file_findings(art)


def test_the_directory_stays_the_artifact_check(tmp_path) -> None:
    art = tmp_path / "art"
    shutil.copytree(ARTIFACTS / "qwen3_moe_g2", art)
    (art / "notes.py").write_text("x = 1\n")
    code, doc = verify(art)
    assert code == 1
    codes = {f["code"] for f in doc["artifacts"][0]["checks"]["outputs"]["findings"]}
    assert "outputs.unrecorded_code" in codes
    # its own codegen_meta.json, next to its code, stands for the directory
    code, doc = verify(art / "codegen_meta.json")
    assert code == 1 and doc["artifacts"][0]["checks"]["outputs"]["status"] == "fail"


def test_the_runtime_refuses_a_bare_meta(tmp_path) -> None:
    from hpcodegen.errors import InputError
    from hpcodegen.verify import load_checked_meta

    path = tmp_path / "g2.json"
    shutil.copy(ARTIFACTS / "qwen3_moe_g2" / "codegen_meta.json", path)
    (tmp_path / "modeling_qwen3_moe_gen_npu.py").write_text("raise SystemExit('ran')\n")
    with pytest.raises(InputError) as raised:
        load_checked_meta(path)
    assert [f.code for f in raised.value.findings] == ["load.bare_meta"]


def test_inspect_plan_reads_a_bare_meta(tmp_path) -> None:
    folder = _crowded_folder(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "hpcodegen", "inspect-plan",
                           str(folder / "qwen3_moe_g3.json"), "--json"], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, doc
    assert "torch" not in proc.stderr


def test_launch_refuses_a_bare_meta_before_anything_else(tmp_path) -> None:
    path = tmp_path / "g2.json"
    shutil.copy(ARTIFACTS / "qwen3_moe_g2" / "codegen_meta.json", path)
    proc = subprocess.run([sys.executable, "-m", "hpcodegen", "launch", str(path), "--nproc",
                           "2", "--dry-run", "--json"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2 and [f["code"] for f in doc["findings"]] == ["load.bare_meta"]
