"""The libcst emitter: transformers' modeling source -> our generated modeling module.

Pipeline (each step a small transformer): relative imports made absolute; our runtime
defaults imported once; every non-identity boundary class defined in the file rewritten
(original ``forward`` kept byte-for-byte as ``_forward_impl``, a new ``forward`` with the same
signature and decorators performing the transitions, class attributes that make the class
run exactly like the original until the runtime binds real ops); a banner on top. Classes are
visited in file order and the output depends only on the inputs, so it is byte-reproducible.
"""

from __future__ import annotations

import ast
import io
import itertools
import tokenize
from collections.abc import Iterator, Mapping, Sequence
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


def _banner_header(banner: Sequence[str]) -> list[cst.EmptyLine]:
    """The banner's comment lines and the blank line under them (the module's new header)."""
    header = [cst.EmptyLine(comment=cst.Comment(f"# {line}".rstrip())) for line in banner]
    return [*header, cst.EmptyLine(indent=False)]


def _emit_whole(source_text: str, package: str, rewriter: _RewriteClasses,
                banner: Sequence[str]) -> str:
    """The whole-module transform: parse, visit every node twice, render every node. The
    fallback for a source the spliced path does not take (see :func:`_emit_spliced`)."""
    module = cst.parse_module(source_text)
    module = module.visit(_AbsoluteImports(package))
    module = _add_runtime_import(module)
    module = module.visit(rewriter)
    return module.with_changes(header=[*_banner_header(banner), *module.header]).code


_COMPOUND = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _statements(stmt: ast.AST) -> Iterator[ast.AST]:
    """``stmt`` and every statement nested in its blocks (expressions are not entered: a
    class or an import is a statement)."""
    yield stmt
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        children = getattr(stmt, field, None)
        if isinstance(children, list):
            for child in children:
                yield from _statements(child)


def _touched(stmt: ast.stmt, plans: Mapping[str, ClassPlan]) -> tuple[bool, bool]:
    """Could :class:`_AbsoluteImports` (a relative import) and :class:`_RewriteClasses` (a
    planned class) change ``stmt``? At any depth: a superset of what they change, so a
    statement neither visits keeps its bytes."""
    relative = planned = False
    for s in _statements(stmt):
        relative = relative or (isinstance(s, ast.ImportFrom) and bool(s.level))
        planned = planned or (isinstance(s, ast.ClassDef) and s.name in plans)
    return relative, planned


@dataclass(frozen=True)
class _Region:
    """Lines ``first..last`` (1-based, whole top-level statements) that a transformer visits:
    ``relative`` (a relative import inside) and ``planned`` (a planned class inside)."""

    first: int
    last: int
    relative: bool
    planned: bool

    def merge(self, other: _Region) -> _Region:
        """One region over both (statements that share a line)."""
        return _Region(self.first, max(self.last, other.last), self.relative or other.relative,
                       self.planned or other.planned)


def _first_indent(source_text: str) -> str | None:
    """The module's default indent as libcst detects it (the first INDENT token), or None
    when the source has no indented block."""
    tokens = tokenize.generate_tokens(io.StringIO(source_text).readline)
    return next((t.string for t in tokens if t.type == tokenize.INDENT), None)


def _emit_spliced(source_text: str, tree: ast.Module, package: str,
                  rewriter: _RewriteClasses, banner: Sequence[str]) -> str | None:
    """The whole-module transform's text, computed on the few top-level statements it changes.

    :mod:`ast` (C speed) finds the top-level statements either transformer could change;
    libcst parses, transforms and renders only their text, and every other byte is the
    source's (libcst round-trips untouched text exactly, so the whole-module transform keeps
    those bytes too). A compound statement's span runs to the next top-level statement, so
    the trailing comments libcst gives to its last block (the footer of ``forward``'s body,
    which the rewrite keeps on ``_forward_impl``) move with it. The runtime import goes after
    the end of the last top-level import line before the first def/class, as
    :func:`_add_runtime_import` places it.

    Returns None (the caller runs :func:`_emit_whole`) where the two could differ: other than
    ``\n`` newlines, no trailing newline, a byte-order mark, no top-level import before the
    first def/class, or a segment whose detected indent is not the module's.
    """
    if ("\r" in source_text or "\x0c" in source_text or source_text.startswith("\ufeff")
            or not source_text.endswith("\n")):
        return None
    body = tree.body
    firsts = [min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", ()))])
              for s in body]
    # the insertion point: the end line of the last top-level import's logical line
    insert_after = None
    for i, stmt in enumerate(body):
        if isinstance(stmt, _COMPOUND):
            break
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            insert_after = i
    if insert_after is None:
        return None
    line_ends = list(itertools.accumulate(len(line) + 1 for line in source_text.split("\n")))
    line_ends[-1] -= 1  # the text after the last "\n" is empty
    count = len(body)

    def end_line(i: int) -> int:
        """Last line of statement ``i``'s logical line (``a; b`` share it), or, for a
        compound statement, the line before the next top-level statement."""
        end = body[i].end_lineno or body[i].lineno
        while i + 1 < count and firsts[i + 1] <= end:
            i += 1
            end = max(end, body[i].end_lineno or body[i].lineno)
        if hasattr(body[i], "body"):
            end = firsts[i + 1] - 1 if i + 1 < count else len(line_ends) - 1
        return end

    import_end = end_line(insert_after)
    regions: list[_Region] = []
    for i, stmt in enumerate(body):
        relative, planned = _touched(stmt, rewriter.plans)
        if not (relative or planned):
            continue
        region = _Region(firsts[i], end_line(i), relative, planned)
        if regions and region.first <= regions[-1].last:
            region = regions.pop().merge(region)
        regions.append(region)
    indent = _first_indent(source_text) if regions else None
    absolute = _AbsoluteImports(package)
    pieces = [cst.Module(body=[], header=_banner_header(banner)).code]
    at = line_ends[import_end - 1]  # the runtime import goes here (never inside a region)
    done = 0  # the source offset written so far
    for region in [*regions, None]:
        start = (len(source_text) if region is None
                 else line_ends[region.first - 2] if region.first > 1 else 0)
        if done <= at <= start:
            pieces += [source_text[done:at], RUNTIME_IMPORT]
            done, at = at, -1
        if region is None:
            break
        stop = line_ends[region.last - 1]
        segment = cst.parse_module(source_text[start:stop])
        if indent is not None and segment.default_indent != indent:
            return None
        if region.relative:
            segment = segment.visit(absolute)
        if region.planned:
            segment = segment.visit(rewriter)
        pieces += [source_text[done:start], segment.code]
        done = stop
    pieces.append(source_text[done:])
    return "".join(pieces)


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
    tree = ast.parse(source_text)
    forwards = class_forwards(tree)  # the gates read the original forwards (ast)
    dispatching = dispatching_classes(tree)
    package = module_name.rsplit(".", 1)[0]
    rewriter = _RewriteClasses(plans, forwards, dispatching)
    text = _emit_spliced(source_text, tree, package, rewriter, banner)
    if text is None:
        rewriter = _RewriteClasses(plans, forwards, dispatching)
        text = _emit_whole(source_text, package, rewriter, banner)
    return text, dict(rewriter.done)
