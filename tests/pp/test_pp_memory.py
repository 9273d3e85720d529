"""The memory check of a pipelined launch: per pp rank, what it holds, its stages'
gradients and AdamW state and the activations the frozen schedule keeps in flight on its
stages; a job that cannot fit is refused before anything is built, a tiny one passes; the
in-flight figure is the one ``inspect-plan`` shows (one function)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
sys.path.insert(0, str(Path(__file__).parent))
from pp_launching import generate, generate_pp, gloo_launch, ok_doc, rank_env
from test_check_pipeline import pp_meta

CONFIGS = Path(__file__).parent / "configs"
#: a Llama far larger than any machine this runs on (refused whatever the machine)
HUGE = {"hidden_size": 16384, "intermediate_size": 65536, "num_hidden_layers": 4,
        "num_attention_heads": 128, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 256000}


def _shape(in_flight: int, owned: int = 1000, steps: int = 1):
    from hpcodegen.launch.rank import memory

    job = memory.JobShape(full_numel=4000, local_numel=2000, dtype_bytes=4, seeded=False,
                          parity=False, steps=steps, logits_numel=0, accelerator=False)
    return memory.PipelineShape(job=job, owned_numel=owned, in_flight_bytes=in_flight)


def test_the_estimate_counts_stage_state_and_activations_in_flight():
    from hpcodegen.launch.rank import memory

    need = memory.estimate_pipeline(_shape(in_flight=10_000))
    parts = dict(need.parts)
    assert parts["parameters held"] == 1000 * 4  # the stages' own: the rest is never built
    assert parts["gradients"] == 1000 * 4 and parts["AdamW state"] == 2 * 1000 * 4
    assert parts["activations in flight"] == 10_000
    assert need.device == 4 * 1000 * 4 + 10_000
    more = memory.estimate_pipeline(_shape(in_flight=20_000))
    assert more.device - need.device == 10_000
    assert "AdamW state" not in dict(memory.estimate_pipeline(_shape(0, steps=0)).parts)


def test_the_estimate_imports_no_torch():
    """In a fresh process: a pytest worker may have imported torch for another test."""
    code = ("import sys; from hpcodegen.launch.rank import memory; "
            "job = memory.JobShape(full_numel=4, local_numel=2, dtype_bytes=4, seeded=False, "
            "parity=False, steps=1, logits_numel=0, accelerator=False); "
            "memory.estimate_pipeline(memory.PipelineShape(job=job, owned_numel=1, "
            "in_flight_bytes=8)); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_tiny_budget_refuses_with_the_figures():
    from hpcodegen.launch.rank import memory

    need = memory.estimate_pipeline(_shape(in_flight=3 * 2**30))
    message = memory.check(need, 2, (2**30, "a test budget"), None)
    assert message is not None
    assert "activations in flight 3.0 GiB" in message and "parameters held" in message
    assert "1.0 GiB is available (a test budget)" in message
    assert memory.check(need, 2, (2 * need.device, "enough"), None) is None


@pytest.mark.parametrize(("schedule", "v"), [("1F1B", 1), ("ZBVZeroBubble", 2),
                                             ("Interleaved1F1B", 2), ("DualPipeV", 2)])
def test_in_flight_activations_are_the_ones_inspect_plan_shows(tmp_path, schedule, v):
    from hpcodegen.inspect.pipeline import (
        activation_elements,
        activations_in_flight,
        pipeline_report,
    )
    from hpcodegen.plan.codec import plan_from_meta

    plan = plan_from_meta(pp_meta(schedule, 2, 4, v))
    config = {"hidden_size": 64}
    report = pipeline_report(plan, config=config, batch=8, seq=16, element_bytes=2)
    per_mb = activation_elements(plan, plan.pipeline, config, 8, 16) * 2
    figures = activations_in_flight(plan.pipeline, per_mb)
    assert {s["index"]: s["activation_bytes_in_flight"] for s in report["stages"]} == figures
    assert all(figures[s["index"]] == s["in_flight"] * per_mb for s in report["stages"])
    assert max(s["in_flight"] for s in report["stages"]) > 1  # the schedule keeps several
    per_stage = activations_in_flight(plan.pipeline, {0: 1, 1: 0})
    assert per_stage[0] == report["stages"][0]["in_flight"] and not any(
        per_stage[i] for i in per_stage if i != 0)


def _generate(config_dir: Path, out: Path) -> Path:
    return generate(out, config_dir, "--tp", "1", "--pp", "2", "--pp-schedule", "1F1B",
                    "--microbatches", "4")


@pytest.mark.gloo
@pytest.mark.timeout(600)
def test_a_pipeline_that_cannot_fit_is_refused_before_it_is_built(gloo, tmp_path):
    """The rank job on the session's gloo ranks: every rank refuses (the ranks agree) with
    the pipeline's figures, and nothing is built. The launcher's exit 2 and its line
    ``refused before building the model: rank N cannot fit: <these figures>`` are a real
    launch's in ``tests/launch/test_memory_refusal.py``."""
    config = json.loads((CONFIGS / "llama4" / "config.json").read_text()) | HUGE
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(config))
    art = _generate(tmp_path / "cfg", tmp_path / "art")
    doc = gloo_launch(gloo, 2, {"huge": rank_env(art, tmp_path / "cfg", 2, steps=1)})["huge"]
    statuses = sorted(r["status"] for r in doc["ranks"])
    assert "refused" in statuses and set(statuses) <= {"refused", "ended"}, doc["ranks"]
    for rank in doc["ranks"]:
        assert rank["local_param_bytes"] is None, rank  # nothing was built
        if rank["status"] == "refused":
            message = rank["error"]
            assert "parameters held" in message and "AdamW state" in message, message
            assert "activations in flight" in message and "is available (" in message, message


@pytest.mark.gloo
@pytest.mark.timeout(600)
def test_a_tiny_pipeline_passes_the_check(gloo, tmp_path):
    """The rank job on the session's gloo ranks, as the refusal above (the artifact is
    ``test_pp_launch.py``'s, generated once per process)."""
    art = generate_pp(tmp_path, "llama4", 1, "1F1B")
    doc = ok_doc(gloo_launch(gloo, 2, {"tiny": rank_env(art, "llama4", 2, steps=1)}), "tiny")
    assert all(r["status"] == "ok" and r["local_param_bytes"] for r in doc["ranks"])
