"""verify applies generate's loss-parallel rule (:mod:`hpcodegen.plan.loss_parallel`) to any
meta, so a hand-edited or foreign ``parallel_dims.loss_parallel`` cannot bypass it.

* the ``plan`` check (pure): the flag with tp_size 1, or with no boundary leaving its output
  vocab-sharded (an error in hpcodegen's metas, a warning in foreign ones);
* the ``model`` check (``--hf-config``): a real Inkling whose forward slices the logits to
  ``unpadded_vocab_size``, hand-edited to keep them sharded, fails naming the head, the step
  and its source line; a head left vocab-sharded without the flag fails too; generated and
  reference loss-parallel Llama artifacts verify clean.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import loss_parallel_fixtures as lpf  # noqa: E402
import verify_fixtures as vf  # noqa: E402

from hpcodegen.verify import run_verify  # noqa: E402

pytestmark = pytest.mark.timeout(400)
FLAG = "/parallel_dims/loss_parallel"
LLAMA_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "llama"


def verify(art: Path, config: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = run_verify([art], hf_config=config, output="json", stdout=out, stderr=io.StringIO(),
                      strict="--strict" in extra)
    return code, json.loads(out.getvalue())


def failing(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f["check"], f["code"], f["path"]) for f in doc["findings"]
            if f["severity"] == "error"]


@pytest.fixture(scope="module")
def inkling(tmp_path_factory) -> tuple[Path, Path]:
    return lpf.hand_edited_inkling(tmp_path_factory.mktemp("lp") / "inkling")


def test_flag_with_tp_1_is_an_error_in_our_metas_a_warning_in_foreign_ones() -> None:
    meta = vf.llama_meta(tp=1)
    assert ("plan.loss_parallel_without_tp", FLAG) in vf.codes(vf.run_check("plan", meta),
                                                               "error")
    foreign = {k: v for k, v in meta.items() if k != "generator"}
    result = vf.run_check("plan", foreign)
    assert ("plan.loss_parallel_without_tp", FLAG) in vf.codes(result, "warning")
    assert not vf.codes(result, "error")


def test_flag_without_a_vocab_sharded_head_is_an_error() -> None:
    meta = vf.llama_meta()
    meta["param_plan"]["lm_head"]["out_dst"] = {"output": {"tp": "R"}}  # gathered
    errors = vf.codes(vf.run_check("plan", meta), "error")
    assert errors == {("plan.loss_parallel_no_sharded_head", FLAG)}
    meta["parallel_dims"]["loss_parallel"] = False
    assert not vf.codes(vf.run_check("plan", meta), "error")


def test_hand_edited_loss_parallel_on_a_postprocessing_model_fails_verify(inkling) -> None:
    art, config = inkling
    code, doc = verify(art, config)
    assert code == 1
    assert failing(doc) == [("model", "model.loss_parallel_postprocess", FLAG)]
    message = next(f["message"] for f in doc["findings"] if f["severity"] == "error")
    assert "InklingForCausalLM.forward" in message and "output of lm_head" in message
    assert "an index on the vocabulary dim" in message
    assert "transformers/models/inkling/modeling_inkling.py:" in message


def test_head_left_vocab_sharded_without_the_flag_fails_verify(inkling, tmp_path) -> None:
    import shutil

    art = shutil.copytree(inkling[0], tmp_path / "undeclared")
    meta = vf.read_meta(art)
    meta["parallel_dims"]["loss_parallel"] = False
    vf.save_meta(art, meta)
    code, doc = verify(art, inkling[1])
    assert code == 1 and failing(doc) == [("model", "model.loss_parallel_undeclared", FLAG)]
    undeclared = next(f for f in doc["findings"] if f["code"] == "model.loss_parallel_undeclared")
    assert "lm_head" in undeclared["message"]


def test_generated_example_and_reference_loss_parallel_llama_verify_clean(tmp_path) -> None:
    art = lpf.write_generated(tmp_path / "llama_lp", lpf.config_dict(LLAMA_CONFIG),
                              loss_parallel=True)
    assert vf.read_meta(art)["parallel_dims"]["loss_parallel"] is True
    code, doc = verify(art, LLAMA_CONFIG, "--strict")
    assert code == 0, failing(doc)
    assert doc["artifacts"][0]["checks"]["model"]["status"] == "pass"
    example = LLAMA_CONFIG.parents[1] / "llama_tp2_sp_lp"  # the committed sp + lp example
    assert verify(example, LLAMA_CONFIG, "--strict")[0] == 0
    result = vf.without_derive_infos(
        vf.run_check("model", vf.llama_meta(), hf_config=dict(vf.LLAMA_CONFIG)))
    assert result.status == "pass" and result.findings == []


def test_runtime_gate_refuses_the_flag_with_tp_1(tmp_path) -> None:
    """The runtime's install-time checks include the plan check: the same finding."""
    from hpcodegen.errors import PlanError
    from hpcodegen.verify import RUNTIME_CHECKS, load_checked_meta

    art = vf.build_fixture("llama_hp", tmp_path / "a")
    meta = vf.read_meta(art)
    meta["parallel_dims"]["tp_size"] = 1
    vf.save_meta(art, meta)
    with pytest.raises(PlanError) as info:
        load_checked_meta(art, RUNTIME_CHECKS)
    assert [(f.code, f.where) for f in info.value.findings] == [
        ("plan.loss_parallel_without_tp", FLAG)]


def test_foreign_head_left_vocab_sharded_without_the_flag_is_a_warning(tmp_path) -> None:
    """A meta of another generator (no ``generator`` record, as the existing system's) with
    lm_head out S(-1) and the flag cleared: its own runtime may hand the logits on as a
    DTensor, so verify warns and passes; in a meta hpcodegen wrote it is an error (above)."""
    meta = vf.read_meta(vf.build_fixture("llama_hp", tmp_path / "a"))
    del meta["generator"]
    assert meta["param_plan"]["lm_head"]["out_dst"]["output"]["tp"] == "S(-1)"
    meta["parallel_dims"]["loss_parallel"] = False
    result = vf.run_check("model", meta, hf_config=dict(vf.LLAMA_CONFIG))
    assert result.status != "fail"
    assert vf.codes(result, "warning") == {("model.loss_parallel_undeclared", FLAG)}
