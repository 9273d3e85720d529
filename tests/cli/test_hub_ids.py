"""Hub ids (``org/name``) for --hf-config, --model and --model-dir, from the local HF cache.

The cache is laid out by hand in a temp ``HF_HOME`` exactly as huggingface_hub writes it
(``hub/models--org--name/{refs/main, snapshots/<commit>/config.json}``); every run has
``HF_HUB_OFFLINE=1``, so nothing could be downloaded even if the network were there.

One real ``hpcodegen`` process proves the boundary: huggingface_hub reads ``HF_HOME`` and
``HF_HUB_OFFLINE`` when it is imported, in a fresh interpreter, and the id resolves offline
(``verify --hf-config --skip model``: the id is resolved for the signature check, and without
the model check the process imports no torch or transformers, ~0.3 s of CPU instead of ~6).
The model check on the id's config and the other options run in this process (:mod:`inproc`,
torch already imported) with the cache dir and offline flag huggingface_hub read from those
variables set the same way (``hub`` fixture): what they add is the resolved snapshot used
past the resolution, which no fresh interpreter changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import inproc
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama_tp2"
CONFIG = ROOT / "examples" / "configs" / "llama" / "config.json"
EXE = Path(sys.executable).with_name("hpcodegen")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf_home")
    repo = home / "hub" / "models--tiny-org--tiny-llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    blob = repo / "blobs" / "cfgblob"
    blob.parent.mkdir()
    shutil.copy(CONFIG, blob)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    os.symlink(os.path.relpath(blob, snap), snap / "config.json")
    return home


def cli(hf_home: Path, *args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The installed console script in a fresh process: ``HF_HOME`` and the offline flag are
    what huggingface_hub reads at its import."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


@pytest.fixture
def hub(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """``hpcodegen ARGS...`` in this process, as :func:`cli` would run it: huggingface_hub
    (imported long before, by transformers) gets the cache dir and offline flag it derives
    from ``HF_HOME=hf_home`` and ``HF_HUB_OFFLINE=1`` at import; the variables are set too."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": None}

    def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
        return inproc.run(*args, cwd=cwd, env=env)
    return run


def test_cached_hub_id_works_offline_for_every_option(hf_home: Path, hub: Callable[..., Any],
                                                      tmp_path: Path) -> None:
    verify = cli(hf_home, "verify", EXAMPLE, "--hf-config", "tiny-org/tiny-llama",
                 "--skip", "model", "--json")
    assert verify.returncode == 0, verify.stdout
    checks = json.loads(verify.stdout)["artifacts"][0]["checks"]
    assert checks["signature"]["status"] == "pass" and "model" not in checks, checks
    model = hub("verify", EXAMPLE, "--hf-config", "tiny-org/tiny-llama", "--json")
    assert model.returncode == 0, model.stdout
    checks = json.loads(model.stdout)["artifacts"][0]["checks"]
    assert checks["signature"]["status"] == "pass" and checks["model"]["status"] == "pass"
    inspect = hub("inspect-plan", EXAMPLE, "--hf-config", "tiny-org/tiny-llama",
                  "--batch", "1", "--seq", "8", "--json")
    assert inspect.returncode == 0 and json.loads(inspect.stdout)["volume"]["per_forward_bytes"]
    out = tmp_path / "gen"
    gen = hub("generate", "--model", "tiny-org/tiny-llama", "--tp", "2", "-o", out)
    assert gen.returncode == 0, gen.stderr
    assert "config: tiny-org/tiny-llama" in next(out.glob("modeling_*_gen_npu.py")).read_text()
    meta = json.loads((out / "codegen_meta.json").read_text())
    assert meta["generator"]["inputs"] == {"hub_id": "tiny-org/tiny-llama"}
    check = hub("generate", "--check", out, cwd=tmp_path)  # the recorded hub id
    assert check.returncode == 0 and "up to date" in check.stdout, check.stderr
    dry = hub("launch", EXAMPLE, "--nproc", "2", "--model-dir", "tiny-org/tiny-llama",
              "--dry-run", "--json")
    assert dry.returncode == 0, dry.stdout
    env = json.loads(dry.stdout)["rank_env"][0]
    assert env["HPCODEGEN_MODEL_DIR"].endswith(f"snapshots/{COMMIT}")


def test_uncached_hub_id_says_so(hf_home: Path, hub: Callable[..., Any]) -> None:
    run = hub("verify", EXAMPLE, "--hf-config", "tiny-org/not-downloaded",
              "--skip", "model", "--json")
    assert run.returncode == 2
    (finding,) = [f for f in json.loads(run.stdout)["findings"]
                  if f["code"] == "config.hub_not_cached"]
    assert "local Hugging Face cache" in finding["message"]
    assert str(hf_home) in finding["message"] and "hf download" in finding["hint"]
    gen = hub("generate", "--model", "tiny-org/not-downloaded", "--tp", "2", "-o",
              "/nonexistent/x")
    assert gen.returncode == 2 and "local Hugging Face cache" in gen.stderr


def test_an_existing_local_path_wins_over_a_hub_id(hub: Callable[..., Any],
                                                  tmp_path: Path) -> None:
    local = tmp_path / "tiny-org" / "tiny-llama"
    local.mkdir(parents=True)
    shutil.copy(CONFIG, local / "config.json")
    run = hub("verify", EXAMPLE, "--hf-config", "tiny-org/tiny-llama", "--skip", "model",
              "--json", cwd=tmp_path)
    assert run.returncode == 0
    assert json.loads(run.stdout)["artifacts"][0]["checks"]["signature"]["status"] == "pass"
