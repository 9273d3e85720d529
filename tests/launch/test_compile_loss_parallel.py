"""``launch --compile`` and a loss-parallel artifact on two real gloo ranks: exact parity.

* ``examples/llama_tp2_sp`` compiled per decoder layer (inductor): logits, every gradient
  and two AdamW steps' losses match the unsharded eager model.
* ``examples/llama_tp2_sp_lp`` (``generate --sp --loss-parallel``): inspect-plan shows no
  all_gather on the ``lm_head`` output, and the vocab-parallel cross entropy (no logits
  gather) gives the unsharded loss and gradients over two steps.

``--compile`` is a real launch (its pre-start model check is run in this process first,
``check_in_process``: the launch reads the verdict instead of starting the child, which
imports torch and transformers again; the check itself still judges the same bytes); the
loss-parallel parity runs launch's rank job on the session's kept gloo ranks
(``launch_gloo``: the same job and numbers, no torchrun). The compile reads and writes the
suite's one inductor cache of this run (``tests/conftest.py``: fresh per run, no kernel of
an earlier run is read; the build of inductor's vector-ISA probe is shared with the run's
other compiles).
"""

from __future__ import annotations

import io
import json

import pytest
from launch_gloo import gloo_launch, ok_doc, rank_env
from launch_helpers import LLAMA_CONFIG, REPO, check_in_process, run_cli

pytestmark = pytest.mark.gloo


def _assert_exact(doc: dict, steps: int) -> None:
    assert doc["status"] == "ok", doc.get("message")
    for rank in doc["ranks"]:
        parity = rank["parity"]
        assert rank["status"] == "ok" and parity["mismatched_params"] == []
        assert 0 <= parity["logits_max_diff"] <= 1e-5
        assert 0 <= parity["grad_max_diff"] <= 1e-5
        assert parity["loss_max_diff"] <= 1e-5 and len(rank["losses"]) == steps


@pytest.mark.timeout(420)
def test_compile_check_parity_two_steps_sp():
    check_in_process(REPO / "examples" / "llama_tp2_sp", LLAMA_CONFIG)  # the launch reads it
    run = run_cli(REPO / "examples" / "llama_tp2_sp", "--nproc", "2", "--model-dir",
                  LLAMA_CONFIG, "--device", "cpu", "--compile", "--check-parity", "--steps", "2",
                  "--json", "--timeout", "400", timeout=410)
    assert run.code == 0, run.stdout[-2000:] + run.stderr[-2000:]
    doc = run.json()
    _assert_exact(doc, 2)
    # a warm forward of the job's own compiled graph is timed (no extra no-grad compile)
    assert all(rank["forward_ms"] > 0 for rank in doc["ranks"]), doc["ranks"]
    # the passing run's scratch dir is removed: it is not reported as if it were kept
    assert doc["run_dir"] is None and doc["log_dir"] is None


@pytest.mark.timeout(420)
def test_loss_parallel_artifact_no_logits_gather_and_parity(gloo):
    """The shipped ``examples/llama_tp2_sp_lp`` (``generate --sp --loss-parallel``; the
    example gate regenerates it byte for byte)."""
    from hpcodegen.inspect.options import InspectOptions
    from hpcodegen.inspect.run import run_inspect

    out = REPO / "examples" / "llama_tp2_sp_lp"
    meta = json.loads((out / "codegen_meta.json").read_text())
    assert meta["parallel_dims"]["loss_parallel"] is True
    assert meta["param_plan"]["lm_head"]["out_dst"]["output"]["tp"] == "S(-1)"
    buf = io.StringIO()
    assert run_inspect(InspectOptions(path=str(out), as_json=True), buf, io.StringIO()) == 0
    doc = json.loads(buf.getvalue())
    head = next(b for b in doc["boundaries"] if b["fqn"] == "lm_head")
    assert head["out_ops"] == []  # the logits leave vocab-sharded: no all_gather
    assert [op["kind"] for op in head["in_ops"]] == ["all_gather"]  # sp: the sequence only
    assert doc["loss_parallel_heads"] == ["lm_head"]
    docs = gloo_launch(gloo, 2, {"loss_parallel": rank_env(out, LLAMA_CONFIG, 2, steps=2,
                                                           check_parity=True)})
    _assert_exact({"status": "ok", **ok_doc(docs, "loss_parallel")}, 2)
