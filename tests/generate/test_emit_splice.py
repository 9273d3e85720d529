"""The spliced emitter (libcst on the few top-level statements it changes) writes exactly the
text of the whole-module libcst transform it replaced (kept as the fallback,
``_emit_whole``): on sources built to stress the splice (trailing comments libcst gives to the
last block of a class, statements sharing a line, nested classes and imports, decorators,
leading comments) and on the transformers modeling file of every family the golden bundle
digests cover, with every top-level class that defines a ``forward`` planned."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.generate.emit import emit
from hpcodegen.generate.emit.emit import ClassPlan, emit_modeling
from hpcodegen.generate.emit.modeling_text import defined_classes
from hpcodegen.plan.classify import classify_boundary
from hpcodegen.plan.codec import entry_from_json
from hpcodegen.plan.lowering import class_forwards, dispatching_classes

#: (input placement, output source, output destination): tp_collective, a second
#: tp_collective and identity, cycled over the planned classes
_FORMS = (("S(1)", "P(sum)", "R"), ("S(1)", "P(sum)", "S(1)"), ("R", "R", "R"))


def _plan(arg: str, k: int, deferred: bool) -> ClassPlan:
    in_src, out_src, out_dst = _FORMS[k % len(_FORMS)]
    entry = entry_from_json("m", {
        "in_src": {arg: {"tp": in_src}}, "in_dst": {arg: {"tp": "R"}},
        "out_src": {"output": {"tp": out_src}}, "out_dst": {"output": {"tp": out_dst}},
        "out_names": ["output"], "is_boundary": True})
    return ClassPlan(classify_boundary("m", entry, ["tp"]), deferred_bias=deferred)


def _plans(text: str, extra: tuple[str, ...] = ()) -> dict[str, ClassPlan]:
    """Every top-level class with a forward (deferred biases on a few rewritten ones) plus
    ``extra`` names (nested classes: planned but out of the rewriter's reach)."""
    tree = ast.parse(text)
    forwards, dispatching = class_forwards(tree), dispatching_classes(tree)
    plans = {name: _plan((sig.positional or ("x",))[0], k,
                         deferred=k % 4 == 1 and name not in dispatching)
             for k, (name, sig) in enumerate(sorted(forwards.items()))}
    plans.update({name: _plan("x", 0, False) for name in extra})
    return plans


def _whole(text: str, module_name: str, plans: dict[str, ClassPlan],
           banner: list[str]) -> tuple[str, dict[str, str]]:
    tree = ast.parse(text)
    rewriter = emit._RewriteClasses(plans, class_forwards(tree), dispatching_classes(tree))
    out = emit._emit_whole(text, module_name.rsplit(".", 1)[0], rewriter, banner)
    return out, dict(rewriter.done)


def _check(text: str, module_name: str, plans: dict[str, ClassPlan], spliced: bool) -> None:
    """The splice writes the whole transform's text and forms (``spliced``), or declines."""
    banner = ["line one", "trailing spaces  ", ""]
    want = _whole(text, module_name, plans, banner)
    tree = ast.parse(text)
    rewriter = emit._RewriteClasses(plans, class_forwards(tree), dispatching_classes(tree))
    got = emit._emit_spliced(text, emit._read_source(text), module_name.rsplit(".", 1)[0],
                             rewriter, banner)
    if spliced:
        assert (got, dict(rewriter.done)) == want
    else:
        assert got is None, "the splice took a source it must leave to the whole transform"
        assert emit_modeling(text, module_name, plans, banner) == want


STRESS = '''# a leading comment
"""Module doc."""
import os; from .sibling import thing  # two statements, one line
from ..parent import (
    a,
    b as c,
)
# a comment under the imports

if os.environ.get("X"):
    from . import nested_import

    class Hidden:  # planned, under an if: left as it is
        def forward(self, x):
            return x


def helper():
    from .inner import late
    return late


@decorator(
    arg=1,
)
# between the decorator and the class
class First(Base):
    """Doc."""
    def forward(self, hidden, mask=None):
        return hidden, mask
        # deeper than the class: libcst gives this to the body of forward
    # at the class's indent: the class body's footer

# column 0: the next statement's
class Second:
    attr = 1
    def other(self):
        pass
    def forward(self, x, *args, **kwargs):
        return x


for _ in range(1):
    class InLoop:
        def forward(self, x):
            return x

try:
    from .optional import maybe
except ImportError:
    maybe = None


class Last:
    def forward(self, x):
        if x is None:
            return
        return x
        # the end of the file, indented


# and a column-0 comment at the very end
'''


def test_stress_source_matches_whole_module_transform() -> None:
    plans = _plans(STRESS, extra=("Hidden",))
    _check(STRESS, "pkg.sub.mod", plans, spliced=True)
    assert emit_modeling(STRESS, "pkg.sub.mod", plans, []) == _whole(STRESS, "pkg.sub.mod",
                                                                      plans, [])


EDGES = {
    "indented comments after a column-0 one": (
        "import os\n\n\nclass A:\n    def forward(self, x):\n        return x\n# col0\n"
        "        # indented again\n\n    # class level after a blank\nclass B:\n"
        "    def forward(self, x):\n        return x\n"),
    "the same at the end of the file": (
        "from .a import b\nclass A:\n    def forward(self, x):\n        return x\n# col0\n"
        "        # indented again\n"),
    "whitespace-only lines under forward": (
        "import os\n\n\nclass A:\n    def forward(self, x):\n        return x\n        \n"
        "    \n\nclass B:\n    pass\n"),
    "async forward, a nested class with its own forward": (
        "from . import m\nclass A:\n    class Inner:\n        def forward(self, y):\n"
        "            return y\n    async def forward(self, x):\n        return x\n\n\nx = 1\n"),
    "imports sharing lines, the last one relative": (
        "import a; from .b import c\nfrom .d import (e,\n  f); import g\nclass A:\n"
        "    def forward(self, x):\n        return x\n"),
    "decorators apart, comments between": (
        "import os\n\n@a\n# c\n\n@b\nclass A:\n    \"\"\"d\"\"\"\n"
        "    def forward(self, x):\n        return x\n"),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_sources_match_whole_module_transform(name: str) -> None:
    _check(EDGES[name], "pkg.sub.mod", _plans(EDGES[name]), spliced=True)


@pytest.mark.parametrize("name,text", [
    ("no import before the first def", "def f():\n    pass\n\n\nclass A:\n"
                                       "    def forward(self, x):\n        return x\n"),
    ("crlf newlines", "import os\r\n\r\nclass A:\r\n    def forward(self, x):\r\n"
                      "        return x\r\n"),
    ("no trailing newline", "from .m import x\n\nclass A:\n    def forward(self, x):\n"
                            "        return x"),
    ("module indent two, class indent four", "import os\nif os:\n  pass\n\n\nclass A:\n"
                                             "    def forward(self, x):\n        return x\n"),
])
def test_sources_the_splice_declines_take_the_whole_transform(name: str, text: str) -> None:
    _check(text, "pkg.sub.mod", _plans(text), spliced=False)


def test_errors_are_the_whole_transforms() -> None:
    text = "import os\n\n\nclass A:\n    def other(self):\n        pass\n"
    plans = {"A": _plan("x", 0, False)}
    with pytest.raises(PlanError) as spliced:
        emit_modeling(text, "pkg.mod", plans, [])
    with pytest.raises(PlanError) as whole:
        _whole(text, "pkg.mod", plans, [])
    assert spliced.value.findings == whole.value.findings
    assert [f.code for f in spliced.value.findings] == ["generate.no_forward"]


#: the modeling module of every family tools/bundle_digests.py samples
DIGEST_FAMILIES = ("phi3", "glm4", "gemma2", "falcon", "gpt2", "llama4", "qwen3_moe")


@pytest.mark.parametrize("family", DIGEST_FAMILIES)
def test_digest_families_match_whole_module_transform(family: str) -> None:
    module_name = f"transformers.models.{family}.modeling_{family}"
    spec = importlib.util.find_spec("transformers")  # located, not imported
    assert spec is not None and spec.origin
    text = (Path(spec.origin).parent / "models" / family / f"modeling_{family}.py").read_text(
        encoding="utf-8")
    _check(text, module_name, _plans(text), spliced=True)


def test_remembered_splice_takes_each_banner() -> None:
    """The splice after the banner is remembered per source and plans: a second generate
    with another banner (another config or signature) still writes the whole transform's
    text under its own banner, and a changed plan is not served the first one's text."""
    plans = _plans(STRESS, extra=("Hidden",))
    for banner in (["config: a", "signature: 1"], ["config: b", "", "signature: 2  "], []):
        assert emit_modeling(STRESS, "pkg.sub.mod", plans, banner) == _whole(
            STRESS, "pkg.sub.mod", plans, banner), banner
    fewer = dict(list(plans.items())[1:])
    assert emit_modeling(STRESS, "pkg.sub.mod", fewer, ["x"]) == _whole(
        STRESS, "pkg.sub.mod", fewer, ["x"])


@pytest.mark.parametrize("banner", [["config: a", "", "signature: 1"], ["config: é"],
                                    ["tab\there"], []])
def test_defined_classes_past_a_banner(banner: list[str]) -> None:
    """The classes of a generated module are those ``ast`` reads in its whole text, banner
    included, whether its reading skips the banner or not (a non-ASCII or tab line)."""
    text, _ = emit_modeling(STRESS, "pkg.sub.mod", _plans(STRESS), banner)
    want = {n.name for n in ast.parse(text).body if isinstance(n, ast.ClassDef)}
    assert want and defined_classes(text) == want


def test_defined_classes_reports_syntax_errors_at_the_files_lines() -> None:
    with pytest.raises(SyntaxError) as caught:
        defined_classes("# banner\n\n# more\nclass (:\n")
    assert caught.value.lineno == 4
