"""generate and verify share one rule for the emitted form of a tp_collective class.

A class whose ``forward`` mixes tuple and non-tuple returns cannot be lowered to bare
collectives (``outputs[0]`` would index a tensor), so ``generate`` emits it generic; verify's
``source`` check must expect exactly that, reading the same gates
(:func:`hpcodegen.plan.lowering.lowering_gates`) from the generated ``_forward_impl``.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import shutil
from pathlib import Path

from hpcodegen.artifact.bundle import render_bundle
from hpcodegen.artifact.load import META_NAME
from hpcodegen.generate.emit.emit import emit_modeling
from hpcodegen.generate.emit.modeling_text import class_plans
from hpcodegen.plan.classify import classify_boundary
from hpcodegen.plan.codec import entry_from_json, plan_from_meta
from hpcodegen.plan.lowering import class_forwards, forward_signature, lowering_gates
from hpcodegen.verify import run_verify

MLP_RETURN = "        return down_proj\n"
MIXED = "        if x is None:\n            return x, None\n" + MLP_RETURN


def _transformers_source(meta: dict) -> str:
    """The recorded transformers file, read without importing transformers."""
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent.parent
    return (root / meta["source"]["file_path"]).read_text(encoding="utf-8")


def _regenerate(example: Path, out: Path, edit) -> tuple[str, dict[str, str]]:
    """Emit the example's modeling file from an edited source and re-render the bundle."""
    meta = json.loads((example / META_NAME).read_text())
    source = edit(_transformers_source(meta))
    name = next(example.glob("modeling_*_gen_npu.py")).name
    plans = class_plans(plan_from_meta(meta), meta["boundary_classes"])
    text, forms = emit_modeling(source, meta["source"]["module_name"], plans, ["test"])
    files = {p.name: p.read_bytes() for p in example.iterdir() if p.name != META_NAME}
    files[name] = text.encode("utf-8")
    roles = {name: "modeling", f"{name}.diff": "diff", "__init__.py": "init"}
    meta.pop("outputs")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for file, data in render_bundle(files, roles, meta).items():
        (out / file).write_bytes(data)
    return text, forms


def _mixed(source: str) -> str:
    head, sep, tail = source.partition("class LlamaMLP(")
    assert MLP_RETURN in tail
    return head + sep + tail.replace(MLP_RETURN, MIXED, 1)


def test_mixed_returns_emit_generic_and_verify_passes(repo: Path, tmp_path: Path) -> None:
    example = repo / "examples" / "llama_tp2"
    text, forms = _regenerate(example, tmp_path / "plain", lambda s: s)
    assert forms["LlamaMLP"] == "tp_collective"  # the control: one shape of return
    assert run_verify([tmp_path / "plain"], stdout=io.StringIO()) == 0

    text, forms = _regenerate(example, tmp_path / "mixed", _mixed)
    assert forms["LlamaMLP"] == "generic"
    mlp = text[text.index("class LlamaMLP("):text.index("class LlamaAttention(")]
    assert "# generic because forward has returns of different shapes" in mlp
    assert "_hp_boundary = IDENTITY_BOUNDARY" in mlp and "_hp_boundary_form" not in mlp
    out = io.StringIO()
    assert run_verify([tmp_path / "mixed"], output="json", stdout=out) == 0, out.getvalue()


def test_signature_model_reads_shapes_and_parameters() -> None:
    src = (
        "class A:\n"
        "    def forward(self, x, /, y, *rest, k=1, **kw):\n"
        "        def inner():\n            return\n"
        "        if x:\n            return x, y\n"
        "        return (x, y)\n"
        "class B:\n"
        "    def forward(self, x):\n"
        "        if x:\n            return\n"
        "        return [x]\n"
    )
    sigs = class_forwards(src)
    a, b = sigs["A"], sigs["B"]
    assert (a.positional, a.kwonly, a.varargs, a.varkw) == (("x", "y"), ("k",), "rest", "kw")
    assert (a.returns, a.bare_return) == ("tuple", False)  # the nested bare return is not A's
    assert (b.returns, b.bare_return) == ("single", True)
    func = ast.parse("def forward(self, x):\n    return x if x else (x, x)\n").body[0]
    assert forward_signature(func).returns == "single"  # only literal tuples count
    entry = {"in_src": {"z": {"tp": "S(1)"}}, "in_dst": {"z": {"tp": "R"}},
             "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "R"}},
             "out_names": ["output"], "is_boundary": True}
    form = classify_boundary("b", entry_from_json("b", entry), ["tp"])
    assert lowering_gates(form, b) == ["forward has returns of different shapes",
                                       "inputs ['z'] are not forward parameters"]
