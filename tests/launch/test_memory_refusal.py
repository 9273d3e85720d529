"""A job that cannot fit is refused before anything is built: exit 2 with the figures.

The model is a Llama far larger than any machine this runs on (about 23 billion
parameters: 4 layers of width 16384, a 256000-token vocabulary), so the refusal does not
depend on the machine; the ranks only ever build it on the meta device.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_helpers import LLAMA_CONFIG, check_in_process, run_cli

pytestmark = pytest.mark.gloo

HUGE = {"hidden_size": 16384, "intermediate_size": 65536, "num_hidden_layers": 4,
        "num_attention_heads": 128, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 256000}


@pytest.fixture(scope="module")
def huge(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from hpcodegen.generate.api import GenerateArgs, run_generate

    base = tmp_path_factory.mktemp("huge")
    config = json.loads((LLAMA_CONFIG / "config.json").read_text()) | HUGE
    (base / "cfg").mkdir()
    (base / "cfg" / "config.json").write_text(json.dumps(config))
    assert run_generate(GenerateArgs(base / "cfg", 2, base / "art", verbosity=-1)) == 0
    check_in_process(base / "art", base / "cfg")  # the launch reads the verdict: no child
    return base / "art", base / "cfg"


@pytest.mark.timeout(400)
def test_a_job_that_cannot_fit_is_refused_with_the_figures(huge) -> None:
    artifact, config = huge
    run = run_cli(artifact, "--nproc", "2", "--device", "cpu", "--model-dir", config,
                  "--check-parity", "--steps", "1", "--json", timeout=300)
    assert run.code == 2, run.stdout + run.stderr
    doc = run.json()
    message = doc["message"]
    assert message.startswith("refused before building the model: rank "), message
    assert "of host memory at its peak" in message and "rank(s) on this node need" in message
    assert "unsharded reference" in message and "AdamW state" in message
    assert "is available (" in message and "hint: drop --check-parity" in message
    statuses = sorted(r["status"] for r in doc["ranks"])
    assert "refused" in statuses and set(statuses) <= {"refused", "ended"}
    assert all(r["local_param_bytes"] is None for r in doc["ranks"])  # nothing was built
