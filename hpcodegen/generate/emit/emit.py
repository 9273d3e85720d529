"""The libcst emitter: transformers' modeling source -> our generated modeling module.

Pipeline (each step a small transformer): relative imports made absolute; our runtime
defaults imported once; every non-identity boundary class defined in the file rewritten
(original ``forward`` kept byte-for-byte as ``_forward_impl``, a new ``forward`` with the same
signature and decorators performing the transitions, class attributes that make the class
run exactly like the original until the runtime binds real ops); a banner on top. Classes are
visited in file order and the output depends only on the inputs, so it is byte-reproducible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import libcst as cst

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.emit.forward_text import generic_body, tp_collective_body
from hpcodegen.plan.classify import BoundaryForm
from hpcodegen.plan.lowering import (
    ForwardSignature,
    class_forwards,
    dispatching_classes,
    lowering_gates,
)

RUNTIME_IMPORT = (
    "from hpcodegen.runtime.identity import IDENTITY_BOUNDARY, IDENTITY_TP, no_deferred_bias\n"
)


@dataclass(frozen=True)
class ClassPlan:
    """What to do to one class: its classified form and whether it defers a bias."""

    form: BoundaryForm
    deferred_bias: bool


class _AbsoluteImports(cst.CSTTransformer):
    """``from ...modeling_utils import X`` -> ``from transformers.modeling_utils import X``."""

    def __init__(self, package: str) -> None:
        self.package = package.split(".")

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        level = len(updated.relative)
        if not level:
            return updated
        base = self.package[: len(self.package) - (level - 1)]
        tail = cst.Module([]).code_for_node(updated.module) if updated.module else ""
        dotted = ".".join(base + ([tail] if tail else []))
        return updated.with_changes(relative=[], module=cst.parse_expression(dotted),
                                    whitespace_after_from=cst.SimpleWhitespace(" "))


def _block(lines: Sequence[str]) -> cst.BaseSuite:
    text = "def _f():\n" + "".join(f"    {line}\n" for line in lines)
    return cst.ensure_type(cst.parse_statement(text), cst.FunctionDef).body


def _attrs(names: Sequence[tuple[str, str]]) -> list[cst.BaseStatement]:
    return [cst.parse_statement(f"{n} = {v}\n") for n, v in names]


class _RewriteClasses(cst.CSTTransformer):
    """Rewrites each planned class defined at the top level of the module."""

    def __init__(self, plans: Mapping[str, ClassPlan],
                 forwards: Mapping[str, ForwardSignature], dispatching: set[str]) -> None:
        self.plans = plans
        self.forwards = forwards
        self.dispatching = dispatching
        self.done: dict[str, str] = {}

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    # Only top-level classes are rewritten (as ``class_forwards`` and ``defined_classes``
    # read them): a class defined under ``if is_xlstm_available(): ... else:`` or inside a
    # function is left as it is, and the runtime wraps its instances like a foreign class.
    def visit_If(self, node: cst.If) -> bool:
        return False

    def visit_Try(self, node: cst.Try) -> bool:
        return False

    def visit_With(self, node: cst.With) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        plan = self.plans.get(updated.name.value)
        if plan is None or plan.form.form == "identity":
            return updated
        if plan.form.form == "region" or updated.name.value in self.dispatching:
            # plan.lowering.instance_wrapped: the runtime wraps the instances
            if plan.deferred_bias:
                raise PlanError([error("generate.wrapped_deferred_bias", updated.name.value,
                                       f"{updated.name.value} is wrapped per instance at run "
                                       "time; deferred biases need a rewritten forward")])
            self.done[updated.name.value] = "wrapped"
            return updated
        return self._rewrite(updated, plan)

    def _rewrite(self, node: cst.ClassDef, plan: ClassPlan) -> cst.ClassDef:
        body = list(cst.ensure_type(node.body, cst.IndentedBlock).body)
        index = next((i for i, s in enumerate(body)
                      if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None)
        if index is None:
            raise PlanError([error("generate.no_forward", node.name.value,
                                   f"class {node.name.value} defines no forward to rewrite")])
        forward = cst.ensure_type(body[index], cst.FunctionDef)
        sig = self.forwards[node.name.value]
        form = plan.form
        emitted = form.form
        gates = lowering_gates(form, sig) if emitted == "tp_collective" else []
        emitted = "generic" if gates else emitted
        if emitted == "tp_collective":
            lines = tp_collective_body(form, sig, plan.deferred_bias)
            attrs = [("_hp_boundary_form", '"tp_collective"'), ("_hp_tp", "IDENTITY_TP")]
        else:
            lines = generic_body(form, sig, plan.deferred_bias, gates)
            attrs = [("_hp_boundary", "IDENTITY_BOUNDARY")]
        if plan.deferred_bias:
            attrs.append(("_hp_deferred_bias", "no_deferred_bias"))
        self.done[node.name.value] = emitted
        impl = forward.with_changes(name=cst.Name("_forward_impl"), decorators=[])
        new_forward = forward.with_changes(body=_block(lines),
                                           leading_lines=[cst.EmptyLine(indent=False)])
        body[index: index + 1] = [impl, new_forward]
        body = _insert_attrs(body, _attrs(attrs))
        return node.with_changes(body=node.body.with_changes(body=body))


def _insert_attrs(body: list, attrs: list) -> list:
    """Class attributes after the docstring (if any), then a blank line."""
    at = 1 if body and _is_docstring(body[0]) else 0
    rest = body[at:]
    if rest and not rest[0].leading_lines:
        rest[0] = rest[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    if at and attrs:
        attrs[0] = attrs[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    return body[:at] + attrs + rest


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _add_runtime_import(module: cst.Module) -> cst.Module:
    """Insert our import after the last top-level import before the first def/class."""
    body = list(module.body)
    last = -1
    for i, stmt in enumerate(body):
        if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
            break
        if isinstance(stmt, cst.SimpleStatementLine) and any(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
            last = i
    body.insert(last + 1, cst.parse_statement(RUNTIME_IMPORT))
    return module.with_changes(body=body)


def emit_modeling(source_text: str, module_name: str, plans: Mapping[str, ClassPlan],
                  banner: Sequence[str]) -> tuple[str, dict[str, str]]:
    """Generate the modeling module.

    Args:
        source_text: the transformers modeling file.
        module_name: its dotted module name (anchors the relative imports).
        plans: class name -> what to emit, for every boundary class.
        banner: comment lines (without ``#``) put on top.

    Returns:
        ``(generated text, {class name: emitted form})`` for the classes rewritten.
    """
    forwards = class_forwards(source_text)  # the gates read the original forwards (ast)
    module = cst.parse_module(source_text)
    module = module.visit(_AbsoluteImports(module_name.rsplit(".", 1)[0]))
    module = _add_runtime_import(module)
    rewriter = _RewriteClasses(plans, forwards, dispatching_classes(source_text))
    module = module.visit(rewriter)
    header = [cst.EmptyLine(comment=cst.Comment(f"# {line}".rstrip())) for line in banner]
    module = module.with_changes(header=[*header, cst.EmptyLine(indent=False), *module.header])
    return module.code, dict(rewriter.done)
