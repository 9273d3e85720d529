"""``generate --pp``: the default split balances parameter counts and says so, the meta
carries the section and ``pp_size``, verify passes it, and what cannot be split or
composed yet is refused with the flag that asked for it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pp_launching import CONFIGS, hpc


def _gen(tmp_path, *flags, config="llama4"):
    """``generate`` in this process (the CLI's ``main``): its exit code and stdout, as a
    finished process's ``returncode`` and ``stdout``."""
    out = tmp_path / "art"
    code, text = hpc("generate", "--model", CONFIGS / config, "-o", out, *flags)
    return SimpleNamespace(returncode=code, stdout=text, stderr=""), out


def test_generate_pp_writes_a_verified_pipeline(tmp_path):
    proc, out = _gen(tmp_path, "--tp", "2", "--pp", "2", "--microbatches", "4")
    assert proc.returncode == 0, proc.stderr
    assert "balanced by parameter count" in proc.stdout and "stage 1 (rank 1)" in proc.stdout
    meta = json.loads((out / "codegen_meta.json").read_text())
    pipe = meta["pipeline"]
    assert meta["parallel_dims"]["pp_size"] == 2 and "pp" not in meta["not_covered"]
    assert [s["modules"][0] for s in pipe["stages"]] == ["model.embed_tokens", "model.layers.2"]
    assert pipe["stages"][1]["modules"][-2:] == ["model.norm", "lm_head"]
    assert pipe["replicated_modules"] == ["model.rotary_emb"]
    assert pipe["loss"] == {"reduction": "sum", "normalizer": "global_valid_tokens",
                            "scale_grads": False}
    assert all(s["params_per_rank"] < s["params"] for s in pipe["stages"])
    code, text = hpc("verify", out, "--hf-config", CONFIGS / "llama4")
    assert code == 0, text
    code, text = hpc("generate", "--model", CONFIGS / "llama4", "-o", out, "--tp", "2",
                     "--pp", "2", "--microbatches", "4", "--check")
    assert code == 0, text


def test_a_layout_places_the_layers_as_asked(tmp_path):
    proc, out = _gen(tmp_path, "--tp", "1", "--pp", "2", "--pp-layout", "1,3")
    assert proc.returncode == 0, proc.stderr
    stages = json.loads((out / "codegen_meta.json").read_text())["pipeline"]["stages"]
    assert stages[0]["modules"] == ["model.embed_tokens", "model.layers.0"]
    assert "--pp-layout" in proc.stdout


@pytest.mark.parametrize(("flags", "where", "what"), [
    (["--pp", "8"], "--pp", "8 pipeline stages for 4 layers"),
    (["--pp", "2", "--pp-schedule", "Interleaved1F1B", "--pp-stages-per-rank", "4"], "--pp",
     "8 pipeline stages for 4 layers"),
    (["--pp", "3", "--pp-layout", "2,0,2"], "--pp-layout", "stage 1 would own no module"),
    (["--pp", "2", "--pp-layout", "2,1"], "--pp-layout", "summing to 4"),
    (["--pp", "2", "--pp-schedule", "DualPipe"], "--pp-schedule", "unknown schedule"),
    (["--pp", "2", "--pp-schedule", "DualPipeV", "--microbatches", "3"], "--microbatches",
     "at least one microbatch per stage: 4 stages at pp=2, got 3"),
    (["--pp", "2", "--sp", "--pp-schedule", "ZBVZeroBubble"], "--pp-schedule",
     "partial over tp"),
    (["--pp", "2", "--pp-layout", "x"], "--pp-layout", "cannot read"),
])
def test_impossible_pipelines_are_refused(tmp_path, flags, where, what):
    proc, out = _gen(tmp_path, "--tp", "1" if "--sp" not in flags else "2", *flags, "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode in (1, 2), doc
    assert any(f["path"] == where and what in f["message"] for f in doc["findings"]), doc
    assert not out.exists()


def test_verify_model_checks_the_units_and_the_replicated_rotary(tmp_path):
    proc, out = _gen(tmp_path, "--tp", "1", "--pp", "2")
    assert proc.returncode == 0, proc.stderr
    meta_file = out / "codegen_meta.json"
    meta = json.loads(meta_file.read_text())
    meta["pipeline"]["replicated_modules"] = []
    order = meta["pipeline"]["module_order"]
    order[0], order[1] = order[1], order[0]
    meta_file.write_text(json.dumps(meta))
    code, text = hpc("verify", out, "--only", "model", "--json", "--hf-config",
                     CONFIGS / "llama4")
    assert code == 1
    doc = json.loads(text)
    found = {f["code"]: f["path"] for a in doc["artifacts"] for c in a["checks"].values()
             for f in c["findings"]}
    assert found["model.pp_replicated"] == "/pipeline/replicated_modules"
    assert found["model.pp_units"] == "/pipeline/module_order/0"
