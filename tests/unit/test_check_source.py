"""The ``source`` check: generated classes agree with their classified boundary forms."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

ATTN = [f"model.layers.{i}.self_attn" for i in range(2)]


def artifact(tmp_path: Path, name: str = "llama_hp", source: Callable[[str], str] | None = None,
             meta: Callable[[dict[str, Any]], None] | None = None) -> Path:
    art = vf.build_fixture(name, tmp_path / name)
    if source is not None:
        file = vf.modeling_name(art)
        vf.rewrite_file(art, file, source((art / file).read_text()))
    if meta is not None:
        data = vf.read_meta(art)
        meta(data)
        vf.save_meta(art, data)
    return art


def in_class(cls: str, old: str, new: str) -> Callable[[str], str]:
    """Replace ``old`` by ``new`` once, inside class ``cls`` only."""
    def edit(text: str) -> str:
        head, sep, tail = text.partition(f"class {cls}(")
        assert old in tail
        return head + sep + tail.replace(old, new, 1)
    return edit


def test_g2_and_g3_fixtures_pass(tmp_path: Path) -> None:
    for name in ("qwen3_moe_g2", "qwen3_moe_g3", "llama_hp"):
        result = vf.run_check("source", artifact(tmp_path, name))
        assert result.status == "pass", result.findings
        assert ("source.class_not_in_file", "Embedding") in vf.codes(result, "info")


def test_g2_marker_spelling_is_accepted(tmp_path: Path) -> None:
    g2 = "_hyper_boundary_form"
    art = artifact(tmp_path, source=lambda s: s.replace("_hp_boundary_form", g2))
    assert g2 in (art / vf.modeling_name(art)).read_text()
    assert vf.run_check("source", art).status == "pass"


def test_varargs_forward_is_emitted_generic(tmp_path: Path) -> None:
    varargs = in_class("LlamaMLP", "def _forward_impl(self, x):", "def _forward_impl(self, *x):")
    unmarked = in_class("LlamaMLP", '    _hp_boundary_form = "tp_collective"\n', "")
    art = artifact(tmp_path, source=lambda s: unmarked(varargs(s)))
    assert vf.run_check("source", art).status == "pass"
    art2 = artifact(tmp_path / "b", source=varargs)
    assert vf.codes(vf.run_check("source", art2), "error") == {("source.stray_marker", "LlamaMLP")}


def test_output_op_off_position_zero_is_emitted_generic(tmp_path: Path) -> None:
    def swap(meta: dict[str, Any]) -> None:
        for fqn in ATTN:
            meta["param_plan"][fqn]["out_names"] = ["attn_weights", "attn_output"]
    result = vf.run_check("source", artifact(tmp_path, meta=swap))
    assert vf.codes(result, "error") == {("source.stray_marker", "LlamaAttention")}


def test_generic_class_with_tp_marker(tmp_path: Path) -> None:
    edit = in_class("Qwen3MoeAttention", "    def __init__",
                    '    _hp_boundary_form = "tp_collective"\n\n    def __init__')
    result = vf.run_check("source", artifact(tmp_path, "qwen3_moe_g3", source=edit))
    assert vf.codes(result, "error") == {("source.stray_marker", "Qwen3MoeAttention")}


def test_tp_forward_must_not_call_the_generic_engine(tmp_path: Path) -> None:
    edit = in_class("LlamaMLP", "        x = self._hp_tp.all_gather(x, dim=1)\n",
                    "        x = self._hp_boundary.redistribute_inputs(x)\n")
    result = vf.run_check("source", artifact(tmp_path, source=edit))
    assert vf.codes(result, "error") == {("source.generic_call_in_tp_forward", "LlamaMLP")}


def test_parallel_state_lookup_in_forward(tmp_path: Path) -> None:
    edit = in_class("LlamaMLP", "        outputs = self._forward_impl(x)\n",
                    "        get_parallel_state()\n        outputs = self._forward_impl(x)\n")
    result = vf.run_check("source", artifact(tmp_path, source=edit))
    assert vf.codes(result, "error") == {("source.parallel_state_call", "LlamaMLP")}


def test_deferred_bias_hook_must_match_the_plan(tmp_path: Path) -> None:
    def declare(meta: dict[str, Any]) -> None:
        for fqn in ATTN:
            meta["param_plan"][fqn]["deferred_bias_params"] = ["o_proj.bias"]
            meta["param_plan"][fqn]["params"]["o_proj.bias"] = {"tp": "R"}
    result = vf.run_check("source", artifact(tmp_path, meta=declare))
    assert vf.codes(result, "error") == {("source.deferred_bias_hook", "LlamaAttention")}
    hook = in_class("LlamaAttention", "        return outputs\n",
                    "        outputs = self._hp_deferred_bias(outputs)\n        return outputs\n")
    assert vf.run_check("source", artifact(tmp_path / "b", source=hook, meta=declare)).status \
        == "pass"
    result = vf.run_check("source", artifact(tmp_path / "c", source=hook))
    assert vf.codes(result, "error") == {("source.deferred_bias_hook", "LlamaAttention")}


def test_entrypoint_info_only_when_absent(tmp_path: Path) -> None:
    art = artifact(tmp_path, source=lambda s: s + "\n\ndef hp_parallelize(model, mesh):\n"
                   "    return None\n")
    result = vf.run_check("source", art)
    assert ("source.entrypoint_absent", "/entrypoints/parallelize") not in vf.codes(result)


def test_model_and_external_classes_must_be_defined(tmp_path: Path) -> None:
    def rename(meta: dict[str, Any]) -> None:
        meta["model_class"] = "Qwen3MoeForCausalLMX"
        meta["external_state_classes"] = ["Qwen3MoeSparseMoeBlock", "Missing"]
    result = vf.run_check("source", artifact(tmp_path, "qwen3_moe_g2", meta=rename))
    assert vf.codes(result, "error") == {("source.model_class_missing", "/model_class"),
                                         ("source.external_class_missing",
                                          "/external_state_classes/1")}


def test_unclassifiable_plan_is_reported_not_crashed(tmp_path: Path) -> None:
    def break_plan(meta: dict[str, Any]) -> None:
        meta["param_plan"]["lm_head"]["in_src"] = ["input"]
    result = vf.run_check("source", artifact(tmp_path, meta=break_plan))
    assert ("source.unclassified", "") in vf.codes(result, "info")
    assert result.status == "pass"


def test_external_state_class_must_not_carry_the_tp_marker(tmp_path: Path) -> None:
    edit = in_class("Qwen3MoeSparseMoeBlock", "    ep_enable = False\n",
                    '    ep_enable = False\n    _hp_boundary_form = "tp_collective"\n')
    result = vf.run_check("source", artifact(tmp_path, "qwen3_moe_g3", source=edit))
    assert vf.codes(result, "error") == {("source.stray_marker", "Qwen3MoeSparseMoeBlock")}
