"""The wheel as users get it: a fresh venv, every verb run from it outside the checkout.

One wheel build for the module; one venv per lane (``newest``: no constraints, the registry's
newest releases; ``floor``: every lower bound exactly; see install_lane.py), filled as a user
would: the core alone (``verify``, ``inspect-plan``, ``schema``; no torch), then ``[hub]``
(Hub ids from the local cache), then torch 2.13.0 first and ``[runtime]`` (``generate``,
``launch --nproc 2 --check-parity``, ``export``). The tests of one lane run in file order, the
core's before the runtime is installed. Every verb runs from a temp dir with the venv's own
python, so nothing of the checkout is importable: as the console script's process, or, for
the light core commands whose subject is the verb's output with these versions, several
through the function that script calls in one interpreter (``Lane.run_many``; the gate and a
usage error stay script processes).

Both lanes run every verb, the heavy ones included. The newest lane must (a new release
can break any verb). The floor lane's ``launch`` and ``export`` repeat nothing either: they
are the only runs of ``[runtime]``'s floors past generate and the model check (the module
generated from transformers 4.57's source, run on 2 gloo ranks against 4.57's unsharded
model; psutil 5.9.4 where the launcher checks that no rank outlived the job; safetensors
0.4.3 writing the export). Without them (~27 CPU-s) those floors would be declared, not run.

verify's model check (torch and transformers imported, the plan derived: ~6 s of CPU) runs
once per lane: in the launch's pre-start child (``hpcodegen verify --only model`` with the
venv's python), whose pass lands in a verdict cache of the lane's own; the lane's
``verify --hf-config`` skips it and checks the signature.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import zipfile
from pathlib import Path

import pytest
from install_lane import HEAVY, HUB_DEPS, ROOT, Lane, build_wheel
from packaging.version import Version

EXAMPLE = ROOT / "examples" / "llama_tp2"
CONFIG = ROOT / "examples" / "configs" / "llama"
LANES = ("newest", "floor")
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src"))


@pytest.fixture(scope="module", params=LANES)
def lane(request: pytest.FixtureRequest, wheel: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Lane:
    lane = Lane.create(request.param, tmp_path_factory.mktemp(f"lane-{request.param}"), wheel)
    lane.install()
    return lane  # left to pytest's temp-dir rotation: torch's files are hard links, no space


@pytest.fixture(scope="module")
def work(lane: Lane, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's directory: the cwd of every verb, outside the checkout."""
    return tmp_path_factory.mktemp(f"work-{lane.name}")


def _assert_floors(lane: Lane, extra: str = "") -> None:
    if lane.name != "floor":
        return
    installed = lane.installed()
    wrong = {d: installed.get(re.sub(r"[-_.]+", "-", d)) for d, v in lane.floors(extra).items()
             if Version(installed.get(re.sub(r"[-_.]+", "-", d), "0").split("+")[0])
             != Version(v)}
    assert not wrong, f"not at their floors: {wrong}"


def _ok(proc, *what) -> None:
    assert proc.returncode == 0, (what, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr


def test_wheel_ships_every_package_file(wheel: Path) -> None:
    """Packages are found, not listed: every source and data file of the package is in the
    wheel (``cli/`` and ``schemas/`` under ``hpcodegen/``), and nothing at the top level
    but ``hpcodegen`` and its metadata."""
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for src, dest in (("hpcodegen", "hpcodegen"), ("cli", "hpcodegen/cli"),
                      ("schemas", "hpcodegen/schemas")):
        for path in (ROOT / src).rglob("*"):
            if path.suffix in {".py", ".json", ".yaml"} and "__pycache__" not in path.parts:
                expected.add(f"{dest}/{path.relative_to(ROOT / src).as_posix()}")
    expected.discard("hpcodegen/generate/examples.py")  # dev-only (setup.py)
    assert "hpcodegen/checkpoint/export.py" in expected
    assert not expected - names, sorted(expected - names)
    tops = {n.split("/")[0] for n in names} - {"hpcodegen"}
    assert len(tops) == 1 and re.fullmatch(r"hpcodegen-[0-9.]+\.dist-info", tops.pop())


def test_wheel_has_license_and_no_dev_modules(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    licenses = [n for n in names if n.endswith("/LICENSE")]
    assert licenses, names
    text = zipfile.ZipFile(wheel).read(licenses[0]).decode()
    assert "Apache License" in text and "Version 2.0" in text
    assert "hpcodegen/generate/examples.py" not in names
    assert "hpcodegen/schemas/codegen_meta.schema.json" in names
    assert not [n for n in names if n.startswith("cli/")]  # installs as hpcodegen.cli
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    core = [ln for ln in metadata.splitlines()
            if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert not [ln for ln in core if re.search(r"\b(torch|transformers)\b", ln)], core


def test_core_install_pulls_no_torch(lane: Lane) -> None:
    assert not HEAVY & set(lane.installed())
    _assert_floors(lane)


def test_core_verbs_run_from_the_core_install(lane: Lane, work: Path) -> None:
    """The installed console script runs the gate (``verify``, exit 0) and a typer usage
    error (exit 2, as JSON) as processes; the other commands, whose subject is what the verbs
    print and return with these versions, run through the function that script calls, all in
    one interpreter of the lane's python (``Lane.run_many``: one start, not nine)."""
    _ok(lane.run("verify", EXAMPLE, cwd=work), "verify")
    usage = lane.run("verify", EXAMPLE, "--bogus", "--json", cwd=work)  # typer's usage error
    assert usage.returncode == 2 and json.loads(usage.stdout)["findings"][0]["code"] == "cli.usage"
    runs = lane.run_many({
        "inspect-plan": ["inspect-plan", EXAMPLE], "--help": ["--help"],
        "verify --help": ["verify", "--help"],
        "verify --hf-config": ["verify", EXAMPLE, "--hf-config", CONFIG, "--skip", "model"],
        "inspect-plan --mesh": ["inspect-plan", EXAMPLE, "--mesh", "tp=4"],
        "--version": ["--version"], "schema": ["schema"],
        "generate": ["generate", "--model", CONFIG, "--tp", "2", "-o", work / "o"],
        "launch": ["launch", EXAMPLE, "--nproc", "2", "--json"]}, cwd=work)
    for name in ("inspect-plan", "--help", "verify --help", "verify --hf-config",
                 "inspect-plan --mesh", "--version", "schema"):
        _ok(runs[name], name)
    assert json.loads(runs["schema"].stdout)["type"] == "object"
    missing = runs["generate"]
    assert missing.returncode == 2 and "hpcodegen[runtime]" in missing.stderr, missing
    launch = runs["launch"]
    assert launch.returncode == 2 and "hpcodegen[runtime]" in launch.stdout, launch


def test_core_install_gates_a_rule_file_familys_artifact(lane: Lane, work: Path,
                                                        mpt_tp2: Path) -> None:
    """An mpt tp 2 artifact (its plan from the YAML rule file; made by the dev venv, once:
    conftest.py) passes verify and inspect-plan in the core install: no torch, no pyyaml
    (the four commands in one interpreter of the lane's python: ``Lane.run_many``)."""
    assert not {"torch", "pyyaml"} & set(lane.installed())
    art = mpt_tp2
    runs = lane.run_many({"verify": ["verify", art], "inspect-plan": ["inspect-plan", art],
                          "inspect-plan --mesh": ["inspect-plan", art, "--mesh", "tp=4"],
                          "inspect-plan --json": ["inspect-plan", art, "--json"]}, cwd=work)
    for name, run in runs.items():
        _ok(run, name)


def test_hub_extra_reads_a_hub_id_from_the_local_cache(lane: Lane, work: Path) -> None:
    """[hub] on a core install: ``--hf-config org/name`` from a hand-laid HF cache, offline."""
    lane.install("hub")
    _assert_floors(lane, "hub")
    assert not (HEAVY - HUB_DEPS) & set(lane.installed())
    repo = work / "hf_home" / "hub" / "models--tiny-org--tiny-llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(HUB_COMMIT)
    snap = repo / "snapshots" / HUB_COMMIT
    snap.mkdir(parents=True)
    shutil.copy(CONFIG / "config.json", snap / "config.json")
    proc = lane.run("verify", EXAMPLE, "--hf-config", "tiny-org/tiny-llama", "--skip", "model",
                    "--json", cwd=work, env={"HF_HOME": str(work / "hf_home")})
    _ok(proc)
    checks = json.loads(proc.stdout)["artifacts"][0]["checks"]
    assert checks["signature"]["status"] == "pass"


@pytest.fixture(scope="module")
def runtime(lane: Lane) -> Lane:
    """torch==2.13.0 installed first, then the wheel's ``[runtime]`` extra."""
    lane.install_torch_first()
    lane.install("runtime")
    _assert_floors(lane, "runtime")
    return lane


@pytest.fixture(scope="module")
def generated(runtime: Lane, work: Path) -> Path:
    out = work / "llama_tp2"
    _ok(runtime.run("generate", "--model", CONFIG, "--tp", "2", "-o", out, cwd=work), "generate")
    return out


@pytest.fixture(scope="module")
def launched(runtime: Lane, generated: Path, work: Path) -> tuple[dict, Path, Path]:
    """One launch: its model check, parity with the unsharded model, one AdamW step, a DCP
    checkpoint. Its verdict cache is a fresh directory of the lane's (``HPCODEGEN_CHECK_CACHE``):
    no pass recorded elsewhere can stand in for the check, and the one it records is read."""
    ckpt, verdicts = work / "ckpt", work / "check-cache"
    proc = runtime.run("launch", generated, "--nproc", "2", "--model-dir", CONFIG,
                       "--check-parity", "--steps", "1", "--save", ckpt, "--json",
                       "--timeout", "400", cwd=work, timeout=500,
                       env={"HPCODEGEN_CHECK_CACHE": str(verdicts)})
    _ok(proc, "launch")
    return json.loads(proc.stdout), ckpt, verdicts


def test_generate_writes_an_artifact_for_the_installed_transformers(
        runtime: Lane, generated: Path, work: Path) -> None:
    meta = json.loads((generated / "codegen_meta.json").read_text())
    version = runtime.installed()["transformers"]
    assert meta["source"]["transformers_version"] == version
    assert any("S(" in json.dumps(entry) for fqn, entry in meta["param_plan"].items()
               if ".layers.0." in fqn)  # a decoder layer is split
    # the model check runs once per lane, in the launch (test_launch_ran_the_model_check...)
    proc = runtime.run("verify", generated, "--hf-config", CONFIG, "--skip", "model", "--json",
                       cwd=work)
    _ok(proc, "verify --hf-config")
    checks = json.loads(proc.stdout)["artifacts"][0]["checks"]
    assert checks["signature"]["status"] == "pass" and "model" not in checks


def test_launch_ran_the_model_check_in_the_venv(runtime: Lane, generated: Path,
                                                launched: tuple[dict, Path, Path]) -> None:
    """The launch's pre-start model check ran with the lane's torch and transformers on
    this artifact and passed with no warning: its record, the only one in the lane's
    fresh verdict cache (a failed check refuses the launch and records nothing)."""
    _, _, verdicts = launched
    records = [json.loads(p.read_text()) for p in sorted(verdicts.glob("*.json"))]
    assert len(records) == 1, records
    (record,) = records
    meta = hashlib.sha256((generated / "codegen_meta.json").read_bytes()).hexdigest()
    installed = runtime.installed()
    assert record["verdict"] == "pass" and record["warnings"] == [], record
    assert record["inputs"]["meta"] == meta, (record["inputs"], meta)
    assert record["inputs"]["transformers"] == installed["transformers"], record["inputs"]
    assert record["inputs"]["torch"] == installed["torch"], record["inputs"]


def test_launch_two_ranks_checks_parity(launched: tuple[dict, Path, Path]) -> None:
    doc, _, _ = launched
    assert doc["status"] == "ok" and [r["rank"] for r in doc["ranks"]] == [0, 1]
    for rank in doc["ranks"]:
        assert rank["status"] == "ok" and rank["parity"]["mismatched_params"] == []
        assert 0 <= rank["parity"]["logits_max_diff"] <= 1e-5
        assert 0 <= rank["parity"]["grad_max_diff"] <= 1e-5
        assert len(rank["losses"]) == 1


def test_export_writes_an_hf_dir(runtime: Lane, launched: tuple[dict, Path, Path],
                                 work: Path) -> None:
    _, ckpt, _ = launched
    out = work / "hf"
    _ok(runtime.run("export", ckpt, "-o", out, cwd=work), "export")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and (out / "model.safetensors").stat().st_size > 0
