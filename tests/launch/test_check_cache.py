"""The model check's verdict cache: a pass is reused only for the very bytes it judged.

Every input of the key (meta, generated modules, config, --allow-target, the package's own
files) is changed one at a time and must miss; a damaged or foreign record must miss; a
refusal is never recorded; and a launch of an artifact whose meta changed by one byte after
a pass was recorded runs the check again and is refused by it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_helpers import EXAMPLE, LLAMA_CONFIG, run_cli

from hpcodegen.artifact.digest import meta_signature
from hpcodegen.launch.launcher import check_cache
from hpcodegen.launch.launcher.check_cache import (
    CACHE_ENV,
    cache_dir,
    load_verdict,
    store_verdict,
    verdict_inputs,
)
from hpcodegen.launch.launcher.model_check import cached_model_check, run_model_check

CONFIG = LLAMA_CONFIG / "config.json"
WARNING = {"code": "model.note", "severity": "warning", "path": "lm_head", "file": None,
           "message": "a warning the pass carried", "expected": None, "hint": None}


def _artifact(tmp: Path) -> tuple[Path, Path]:
    art = tmp / "art"
    shutil.copytree(EXAMPLE, art)
    config = tmp / "config.json"
    shutil.copyfile(CONFIG, config)
    return art, config


def _inputs(art: Path, config: Path, allow: tuple[str, ...] = ()) -> dict:
    return verdict_inputs(art / "codegen_meta.json", config, allow)


def _row_split_head(art: Path) -> None:
    """lm_head split on its input dim, the signature kept consistent: only the model
    check's derivation refuses it."""
    meta = json.loads((art / "codegen_meta.json").read_text())
    meta["param_plan"]["lm_head"]["params"]["weight"]["tp"] = "S(1)"
    meta["signature"] = meta_signature(meta)
    (art / "codegen_meta.json").write_text(json.dumps(meta, indent=2))


def test_cache_dir_follows_the_environment(tmp_path) -> None:
    assert cache_dir({CACHE_ENV: str(tmp_path)}) == tmp_path
    for off in ("off", "0", "OFF", ""):
        assert cache_dir({CACHE_ENV: off}) is None
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "hpcodegen" / "model-check"
    assert cache_dir({}) == Path.home() / ".cache" / "hpcodegen" / "model-check"


def test_a_pass_is_reused_only_for_the_same_inputs(tmp_path) -> None:
    art, config = _artifact(tmp_path)
    cache = tmp_path / "cache"
    inputs = _inputs(art, config)
    assert load_verdict(cache, inputs) is None
    assert store_verdict(cache, inputs, [WARNING]) is not None
    assert load_verdict(cache, _inputs(art, config)) == [WARNING]

    def misses() -> bool:
        return load_verdict(cache, _inputs(art, config)) is None

    # one changed byte in each file the check depends on: a miss; restored: a hit again
    for path in (art / "codegen_meta.json", art / "modeling_llama_gen_npu.py",
                 art / "__init__.py", config):
        original = path.read_bytes()
        path.write_bytes(original + b" ")
        assert misses(), path.name
        path.write_bytes(original)
        assert not misses(), path.name
    extra = art / "extra_module.py"  # a new module beside the generated one
    extra.write_text("X = 1\n")
    assert misses()
    extra.unlink()
    assert load_verdict(cache, _inputs(art, config, ("mypkg.",))) is None
    other = dict(inputs, torch="0.0", hpcodegen_files="0" * 64)
    assert load_verdict(cache, other) is None


def test_damaged_foreign_and_failed_records_are_misses(tmp_path) -> None:
    art, config = _artifact(tmp_path)
    cache = tmp_path / "cache"
    inputs = _inputs(art, config)
    path = store_verdict(cache, inputs, [])
    assert path is not None and load_verdict(cache, inputs) == []
    record = json.loads(path.read_text())
    for damaged in (path.read_text()[:40], "[]", json.dumps({**record, "verdict": "fail"}),
                    json.dumps({**record, "inputs": {**inputs, "meta": "0" * 64}}),
                    json.dumps({**record, "warnings": "none"})):
        path.write_text(damaged)
        assert load_verdict(cache, inputs) is None, damaged
    assert not list(cache.glob(".*.tmp"))  # atomic writes leave no temp file
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    assert store_verdict(blocked, inputs, []) is None  # unusable cache: no record, no error


def test_the_package_digest_covers_its_files_and_imports_no_torch() -> None:
    code = ("import sys; from hpcodegen.launch.launcher.check_cache import package_digest; "
            "print(package_digest()); print('torch' in sys.modules, 'transformers' in "
            "sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out[1:] == ["False", "False"]
    assert out[0] == check_cache.package_digest() and len(out[0]) == 64


@pytest.mark.timeout(400)
def test_a_meta_changed_after_its_pass_was_recorded_is_checked_again_and_refused(
        tmp_path) -> None:
    """Two model-check children in all: the pass that is recorded, and the launch of the
    changed meta, whose check runs again and refuses it (nothing recorded, no rank)."""
    art, config = _artifact(tmp_path)
    cache = tmp_path / "cache"
    assert cached_model_check(art, config, (), cache) is None
    assert run_model_check(art, config, timeout=300, cache=cache) == []
    assert cached_model_check(art, config, (), cache) == []  # recorded: the next launch skips
    assert cached_model_check(art, config, (), None) is None  # no cache: always checked
    _row_split_head(art)
    assert cached_model_check(art, config, (), cache) is None
    run = run_cli(art, "--nproc", "2", "--device", "cpu", "--model-dir", config.parent,
                  "--json", timeout=300, env={CACHE_ENV: str(cache)})
    assert run.code == 1, (run.stdout, run.stderr)
    doc = run.json()
    assert "model.leaf_output" in {f["code"] for f in doc["findings"]}, doc
    assert doc.get("pids") in (None, [])
    assert cached_model_check(art, config, (), cache) is None  # a refusal is not recorded
    assert len(list(cache.glob("*.json"))) == 1
