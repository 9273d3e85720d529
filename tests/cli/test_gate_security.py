"""Hostile artifacts through the real CLI: one test per hole of issue 10 (and its variants).

Each artifact is a copy of ``examples/llama_tp2`` edited as an attacker would, with the
signature and recorded hashes made consistent again, so only the rule under test can catch
it. A marker file written by the artifact's code shows whether any of it ran.
"""

from __future__ import annotations

import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import inproc
import pytest

from hpcodegen.artifact.digest import bytes_digest, meta_signature

pytestmark = pytest.mark.timeout(400)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama_tp2"
CONFIG = REPO / "examples" / "configs" / "llama"
MODELING = "modeling_llama_gen_npu.py"
_BIN = Path(sys.executable).parent / "hpcodegen"
HPCODEGEN = [str(_BIN)] if _BIN.exists() else [sys.executable, "-m", "hpcodegen"]
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def cli(*args: Any, env: dict[str, str] | None = None, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    """The installed ``hpcodegen`` as a user runs it."""
    return subprocess.run([*HPCODEGEN, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO,
                          env={**os.environ, "NO_COLOR": "1", **(env or {})})


def artifact(tmp: Path, edit: Callable[[dict[str, Any]], None] | None = None,
             prepend: str = "", name: str = "art") -> Path:
    """A copy of the example; ``edit`` the meta, ``prepend`` code to the modeling file; the
    hashes and the signature are recomputed, as a careful attacker would."""
    art = tmp / name
    shutil.copytree(EXAMPLE, art, ignore=shutil.ignore_patterns("__pycache__"))
    meta_path = art / "codegen_meta.json"
    meta = json.loads(meta_path.read_text())
    if prepend:
        path = art / MODELING
        path.write_text(prepend + path.read_text())
        meta["outputs"]["modeling"] = bytes_digest(path.read_bytes())
    if edit is not None:
        edit(meta)
    meta["signature"] = meta_signature(meta)
    meta_path.write_text(json.dumps(meta, indent=2))
    return art


def marker_code(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('artifact code ran')\n"


def verify_json(*args: Any) -> tuple[int, dict[str, Any]]:
    """``verify --json``'s exit code and report, through the entry point in this process
    (:mod:`inproc`); what must stay out of a process (an import, a run) is checked with
    ``cli`` and the probes, in processes of their own."""
    run = inproc.run("verify", *args, "--json", cwd=REPO)
    return run.returncode, json.loads(run.stdout)


def errors(doc: dict[str, Any], index: int | None = None) -> set[tuple[str, str]]:
    arts = doc["artifacts"] if index is None else [doc["artifacts"][index]]
    return {(f["code"], f["path"]) for art in arts
            for check in art["checks"].values() for f in check["findings"]
            if f["severity"] == "error"}


def launch_refusal(art: Path, *args: Any) -> tuple[int, list[str]]:
    """``launch --json`` of a request refused before start: exit code and finding codes."""
    run = cli("launch", art, "--nproc", "1", *args, "--device", "cpu", "--model-dir", CONFIG,
              "--json")
    doc = json.loads(run.stdout)
    assert doc["status"] in ("fail", "error") and doc["findings"], doc
    return run.returncode, [f["code"] for f in doc["findings"]]


def _inject(target: str) -> Callable[[dict[str, Any]], None]:
    def edit(meta: dict[str, Any]) -> None:
        meta["injections"] = [{"match": "model.layers.0.mlp",
                               "local_compute_fn": {"_target_": target}}]
    return edit


# 1. bytecode poisoning ---------------------------------------------------------------------

def test_bytecode_beside_the_modeling_file_fails_verify_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    art = artifact(tmp_path)
    evil = tmp_path / MODELING
    evil.write_text(marker_code(marker) + (art / MODELING).read_text())
    tag = sys.implementation.cache_tag
    py_compile.compile(str(evil), cfile=str(art / "__pycache__" / f"{MODELING[:-3]}.{tag}.pyc"),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    code, doc = verify_json(art, "--strict")
    assert code == 1
    assert ("outputs.unrecorded_code", "__pycache__") in errors(doc)
    assert launch_refusal(art) == (1, ["outputs.unrecorded_code"])
    # the loader itself never reads bytecode, even when the meta is not checked first
    probe = ("import sys; from hpcodegen.artifact.load import load_meta; "
             "from hpcodegen.runtime import import_verified_module as imp; "
             f"imp(load_meta({str(art)!r})); "
             f"print(list(sys.modules[[n for n in sys.modules if n.endswith('{MODELING[:-3]}')]"
             "[0]].__dict__.get('__cached__') or []))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "the poisoned bytecode ran"
    assert sorted(p.name for p in (art / "__pycache__").iterdir()) == [evil.stem + f".{tag}.pyc"]


# 2. check-then-read race -------------------------------------------------------------------

def test_file_changed_between_check_and_import_never_runs(tmp_path: Path) -> None:
    """The documented order (load_verified_meta, then import_verified_module) with a write in
    between: the loader hashes the very bytes it executes, so the write is refused."""
    marker = tmp_path / "ran"
    art = artifact(tmp_path)
    script = tmp_path / "race.py"
    script.write_text(
        "import sys\n"
        "from hpcodegen.runtime import import_verified_module, load_verified_meta\n"
        f"loaded = load_verified_meta({str(art)!r}, {str(CONFIG)!r})\n"
        f"path = {str(art / MODELING)!r}\n"
        f"text = open(path).read()\n"
        f"open(path, 'w').write({marker_code(marker)!r} + text)\n"
        "try:\n"
        "    import_verified_module(loaded)\n"
        "except Exception as exc:\n"
        "    print(exc.findings[0].code)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.strip() == "outputs.sha256_drift", proc.stderr
    assert not marker.exists()


# 3. import before refusal / 4. the gate and the injection registry --------------------------

FOREIGN = ["os.system", "subprocess.Popen", "builtins.exec", "posix.system", "pty.spawn",
           "hpcodegen.launch.rank.worker.main", "hpcodegen.runtime.identity.no_deferred_bias",
           "shutil.rmtree", "sdpa_hf_not_registered"]


def test_verify_reports_targets_outside_the_registry(tmp_path: Path) -> None:
    arts = [artifact(tmp_path, _inject(t), name=f"t{i}") for i, t in enumerate(FOREIGN)]
    for extra in ((), ("--hf-config", CONFIG)):
        code, doc = verify_json(*arts, *extra)
        assert code == 1
        for i, target in enumerate(FOREIGN):
            assert ("plan.foreign_target", "/injections/0/local_compute_fn/_target_") \
                in errors(doc, i), target
    wrapper = artifact(tmp_path, lambda m: m.update(injections=[
        {"match": "lm_head", "inner_wrapper": "os.system"}]), name="wrapper")
    assert ("plan.foreign_target", "/injections/0/inner_wrapper") in errors(
        verify_json(wrapper)[1])


def test_verify_never_imports_a_target_and_allow_target_trusts_a_prefix(tmp_path: Path) -> None:
    pkg = tmp_path / "site" / "evilpkg"
    pkg.mkdir(parents=True)
    marker = tmp_path / "imported"
    (pkg / "__init__.py").write_text(marker_code(marker) + "def run(m):\n    return None\n")
    art = artifact(tmp_path, _inject("evilpkg.run"))
    env = {"PYTHONPATH": str(tmp_path / "site")}
    run = cli("verify", art, "--json", env=env)
    assert run.returncode == 1
    assert ("plan.foreign_target", "/injections/0/local_compute_fn/_target_") \
        in errors(json.loads(run.stdout))
    # (a region injection on the MLP contradicts the example's tp_collective MLP class:
    # the source check says so, which is not what this test is about)
    run = cli("verify", art, "--allow-target", "evilpkg", "--skip", "source", env=env)
    assert run.returncode == 0, run.stdout
    assert not marker.exists(), "verify imported an injection target"
    bad = cli("verify", art, "--allow-target", "", "--json")
    assert bad.returncode == 2
    assert [f["code"] for f in json.loads(bad.stdout)["findings"]] == ["usage.allow_target"]


def test_launch_refuses_a_foreign_target_before_any_artifact_code_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    art = artifact(tmp_path, _inject("os.system"), prepend=marker_code(marker))
    run = cli("launch", art, "--nproc", "1", "--device", "cpu", "--model-dir", CONFIG,
              "--json")
    assert run.returncode == 1
    assert [f["code"] for f in json.loads(run.stdout)["findings"]] == ["plan.foreign_target"]
    assert not marker.exists()
    # the library order of the README: each step refuses before executing anything
    probe = (
        "from hpcodegen.artifact.load import load_meta\n"
        "from hpcodegen.runtime import import_verified_module, load_verified_meta\n"
        "from hpcodegen.runtime import import_generated_module\n"
        "for step in (lambda: load_verified_meta(A), lambda: import_generated_module(A),\n"
        "             lambda: import_verified_module(load_meta(A))):\n"
        "    try:\n"
        "        step()\n"
        "    except Exception as exc:\n"
        "        print(exc.findings[0].code)\n")
    proc = subprocess.run([sys.executable, "-c", f"A = {str(art)!r}\n" + probe],
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["plan.foreign_target"] * 3, proc.stderr
    assert not marker.exists()


# 5. silently wrong plans -------------------------------------------------------------------

def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(meta: dict[str, Any]) -> None:
        node = meta
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


INTEGER_FIELDS = [("parallel_dims", "tp_size"), ("parallel_dims", "dp_size"),
                  ("parallel_dims", "cp_size"), ("outputs", "modeling", "lines"),
                  ("outputs", "init", "lines"), ("source", "line_count")]


VALUES = [2.0, True, False, "2", -1, 10**10, None, [2]]


def test_every_integer_field_is_a_bounded_json_integer(tmp_path: Path) -> None:
    cases = [(field, value) for field in INTEGER_FIELDS for value in VALUES]
    arts = [artifact(tmp_path, _set(field, value), name=f"a{i}")
            for i, (field, value) in enumerate(cases)]
    code, doc = verify_json(*arts, "--only", "schema")
    assert code == 1
    for i, (field, value) in enumerate(cases):
        assert not doc["artifacts"][i]["ok"], (field, value)
        assert any(p == "/" + "/".join(field) for _, p in errors(doc, i)), (field, value)
    ok = artifact(tmp_path, _set(("parallel_dims", "tp_size"), 2), name="ok")
    assert verify_json(ok, "--only", "schema")[0] == 0


def test_float_tp_size_is_refused_by_launch_too(tmp_path: Path) -> None:
    art = artifact(tmp_path, _set(("parallel_dims", "tp_size"), 2.0))
    assert launch_refusal(art, "--nproc", "2") == (1, ["schema.type"])


BAD_PLACEMENTS = ["S(1)\n", "S(0)\r", "R\n", "S(01)", "S(-0)", "S( 1)", "S(100)", "SS(0,0)",
                  "SS(0,10000)", "P(sum)\n", "S(0)\u2028", "Ｓ(0)", "S(\u0661)",
                  "S(" + "9" * 5000 + ")"]


def test_placements_match_the_whole_grammar(tmp_path: Path) -> None:
    where = ("param_plan", "lm_head", "params", "weight", "tp")
    arts = [artifact(tmp_path, _set(where, text), name=f"p{i}")
            for i, text in enumerate(BAD_PLACEMENTS)]
    code, doc = verify_json(*arts)
    assert code == 1
    for i, text in enumerate(BAD_PLACEMENTS):
        codes = {c for c, p in errors(doc, i) if p == "/" + "/".join(where)}
        assert {"schema.pattern", "plan.bad_placement"} <= codes, (text, errors(doc, i))


@pytest.mark.parametrize("op", ["max", "sum", "avg"])
def test_partial_parameter_placement_is_refused(tmp_path: Path, op: str) -> None:
    where = ("param_plan", "model.layers.0.mlp", "params", "down_proj.weight", "tp")
    code, doc = verify_json(artifact(tmp_path, _set(where, f"P({op})")))
    assert code == 1
    assert ("plan.partial_param", "/" + "/".join(where)) in errors(doc)


# 6. crashes and injection in the reports ----------------------------------------------------

def test_oversized_number_is_an_input_error_with_json(tmp_path: Path) -> None:
    art = artifact(tmp_path)
    meta = art / "codegen_meta.json"
    meta.write_text(meta.read_text().replace('"tp_size": 2', '"tp_size": ' + "9" * 5000, 1))
    for constant in ("9" * 5000, "NaN", "-Infinity"):
        meta.write_text(re.sub(r'"tp_size": [^,\n}]+', f'"tp_size": {constant}',
                               meta.read_text()))
        run = cli("verify", art, "--json")
        assert run.returncode == 2, run.stderr
        doc = json.loads(run.stdout)
        assert doc["artifacts"][0]["checks"]["load"]["findings"][0]["code"] == \
            "load.invalid_json"
        assert "internal error" not in run.stderr


@pytest.mark.parametrize("where", ["outputs", "param_plan", "boundary_classes"])
def test_oversized_names_are_findings_not_crashes(tmp_path: Path, where: str) -> None:
    name = "a" * 5000

    def edit(meta: dict[str, Any]) -> None:
        value = {"sha256": "0" * 64, "lines": 1} if where == "outputs" else (
            {"params": {}} if where == "param_plan" else "LlamaMLP")
        meta[where][name] = value
    code, doc = verify_json(artifact(tmp_path, edit))
    assert code == 1
    codes = {c for c, _ in errors(doc)}
    assert not any(c.endswith(".internal") for c in codes), codes
    assert "schema.maxLength" in codes


HOSTILE_KEYS = ["lm_head\nPASS fake", "x\x1b[2J\x1b[32mPASS", "a\rPASS", "b\u2028PASS",
                "c\x00d", "e\u202eSSAP", "f\x85g"]


def _hostile(key: str) -> Callable[[dict[str, Any]], None]:
    def edit(meta: dict[str, Any]) -> None:
        meta["param_plan"][key] = {"params": {key: {key: "R"}}}
        meta["boundary_classes"][key] = key
        meta["tied_pairs"] = [[key, key]]
        meta["outputs"][key] = {"sha256": "0" * 64, "lines": 1}
        meta["mesh_dim_names"] = ["tp", key]
    return edit


def test_reports_escape_control_characters(tmp_path: Path) -> None:
    arts = [artifact(tmp_path, _hostile(key), name=f"k{i}") for i, key in enumerate(HOSTILE_KEYS)]
    junit = tmp_path / "report.xml"
    text = cli("verify", *arts, "--junit", junit, "-v")
    assert text.returncode == 1
    for stream in (text.stdout, text.stderr, junit.read_text()):
        lines = stream.splitlines()
        assert not any(line.lstrip().startswith("PASS") for line in lines), stream
        assert not CONTROL.search(stream.replace("\n", "").replace("\t", ""))
    for element in ET.parse(junit).iter():
        for value in (*element.attrib.values(), element.text or ""):
            assert not CONTROL.search(value.replace("\n", "")), value
    doc = verify_json(*arts)[1]
    for f in (f for a in doc["artifacts"] for c in a["checks"].values() for f in c["findings"]):
        for value in f.values():
            assert value is None or not CONTROL.search(value), f


def test_artifact_dir_name_with_a_newline_is_escaped(tmp_path: Path) -> None:
    art = artifact(tmp_path)
    hostile = art.rename(tmp_path / "x\nPASS forged")
    run = cli("verify", hostile)
    assert run.returncode == 0
    assert not any(line.startswith("PASS forged") for line in run.stdout.splitlines())


# 7. nothing resolves outside the artifact dir ------------------------------------------------

def test_meta_linked_outside_is_refused(tmp_path: Path) -> None:
    art = artifact(tmp_path)
    outside = tmp_path / "elsewhere" / "meta.json"
    outside.parent.mkdir()
    (art / "codegen_meta.json").rename(outside)
    hop = art / "hop.json"
    hop.symlink_to(outside)  # a link inside that points out: nested links are followed
    (art / "codegen_meta.json").symlink_to(hop)
    for path in (art, art / "codegen_meta.json"):
        run = cli("verify", path, "--json")
        assert run.returncode == 2
        assert json.loads(run.stdout)["artifacts"][0]["checks"]["load"]["findings"][0][
            "code"] == "load.escapes"
    run = cli("launch", art, "--nproc", "1", "--device", "cpu", "--model-dir", CONFIG)
    assert run.returncode == 2 and "outside its artifact directory" in run.stderr


def test_recorded_outputs_and_sibling_modules_linked_outside_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "helper.py").write_text(marker_code(marker))
    sub = outside / "pkg"
    sub.mkdir()
    art = artifact(tmp_path, prepend="from .helper import *  # noqa\n")
    (art / "helper.py").symlink_to(outside / "helper.py")
    (art / "linked").symlink_to(sub)

    def record(meta: dict[str, Any]) -> None:
        meta["outputs"]["helper.py"] = bytes_digest((outside / "helper.py").read_bytes())
    meta_path = art / "codegen_meta.json"
    meta = json.loads(meta_path.read_text())
    record(meta)
    meta_path.write_text(json.dumps(meta))
    code, doc = verify_json(art)
    assert code == 1
    assert ("outputs.escapes", "/outputs/helper.py") in errors(doc)
    code, codes = launch_refusal(art)
    assert code == 1 and "outputs.escapes" in codes
    assert not marker.exists()
