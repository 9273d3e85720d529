"""The model check's verdict cache: a pass is reused only for the very bytes it judged.

Every input of the key (meta, generated modules, config, --allow-target, the package's own
files) is changed one at a time and must miss; a damaged or foreign record must miss; a
refusal is never recorded. The end to end case (a launch of an artifact whose meta changed
after a pass was recorded runs the check again and is refused by it) is
``test_model_check_prestart.py``'s: it reads the same two model-check children as that
module's pass and refusal tests.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_helpers import EXAMPLE, LLAMA_CONFIG

from hpcodegen.launch.launcher import check_cache
from hpcodegen.launch.launcher.check_cache import (
    CACHE_ENV,
    cache_dir,
    load_verdict,
    store_verdict,
    verdict_inputs,
)

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
