"""The libcst emitter: transformers' modeling source -> our generated modeling module.

Pipeline (each step a small transformer): relative imports made absolute; our runtime
defaults imported once; every non-identity boundary class defined in the file rewritten
(original ``forward`` kept byte-for-byte as ``_forward_impl``, a new ``forward`` with the same
signature and decorators performing the transitions, class attributes that make the class
run exactly like the original until the runtime binds real ops); a banner on top. Classes are
visited in file order and the output depends only on the inputs, so it is byte-reproducible.

The transformers run on the few top-level statements they change (the planned classes, the
relative imports: located with :mod:`ast`), the other bytes spliced from the source as they
are (:func:`_emit_spliced`): the text the whole-module transform (:func:`_emit_whole`, the
fallback) writes, at a fraction of its cost (a modeling file is ~15k libcst nodes; a generate
rewrites a handful of classes).
"""

from __future__ import annotations

import ast
import functools
import io
import itertools
import tokenize
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

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


@dataclass(frozen=True)
class _Statement:
    """One top-level statement as the splice needs it.

    Attributes:
        first: its first line (1-based; a decorator's when decorated).
        last: the last line of its logical line (``a; b`` share one) or, for a compound
            statement, the line before the next top-level statement: libcst gives the
            comments under a block to that block (the footer of ``forward``'s body, which the
            rewrite keeps on ``_forward_impl``), so they must move with the statement.
        relative: a relative import inside (at any depth): :class:`_AbsoluteImports` visits it.
        classes: the names of the classes inside (at any depth): :class:`_RewriteClasses`
            visits it when one is planned (a superset of what it rewrites: the rest is left).
    """

    first: int
    last: int
    relative: bool
    classes: frozenset[str]


@dataclass(frozen=True)
class _Source:
    """What the emitter reads from a modeling file, independent of the plans (memoized per
    text: generating several layouts of one family in a process reads its file once).

    ``statements`` is None where the splice could differ from the whole-module transform
    (:func:`_emit_spliced` then declines): other than ``\n`` newlines, no trailing newline,
    a form feed or byte-order mark, or no top-level import before the first def/class.
    """

    forwards: Mapping[str, ForwardSignature]
    dispatching: frozenset[str]
    statements: tuple[_Statement, ...] | None
    #: offset just past each line (index 0: line 1)
    line_ends: tuple[int, ...]
    #: the runtime import's offset: the end of the last top-level import's logical line
    import_at: int
    #: the module's default indent as libcst detects it (the first INDENT token)
    indent: str | None


@functools.lru_cache(maxsize=16)
def _read_source(source_text: str) -> _Source:
    """Parse ``source_text`` with :mod:`ast` once: the forwards the gates read, the
    dispatching classes and the spans of the top-level statements."""
    tree = ast.parse(source_text)
    forwards = MappingProxyType(class_forwards(tree))  # the gates read the original forwards
    dispatching = frozenset(dispatching_classes(tree))
    if ("\r" in source_text or "\x0c" in source_text or source_text.startswith("\ufeff")
            or not source_text.endswith("\n")):
        return _Source(forwards, dispatching, None, (), -1, None)
    body = tree.body
    line_ends = tuple(itertools.accumulate(len(line) + 1 for line in source_text.split("\n")))
    line_ends = (*line_ends[:-1], len(source_text))  # nothing after the last "\n"
    firsts = [min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", ()))])
              for s in body]

    def last_line(i: int) -> int:
        end = body[i].end_lineno or body[i].lineno
        while i + 1 < len(body) and firsts[i + 1] <= end:
            i += 1
            end = max(end, body[i].end_lineno or body[i].lineno)
        if hasattr(body[i], "body"):
            end = firsts[i + 1] - 1 if i + 1 < len(body) else len(line_ends) - 1
        return end

    statements = []
    for i, stmt in enumerate(body):
        nested = list(_statements(stmt))
        statements.append(_Statement(
            firsts[i], last_line(i),
            any(isinstance(s, ast.ImportFrom) and s.level for s in nested),
            frozenset(s.name for s in nested if isinstance(s, ast.ClassDef))))
    imports = [i for i, stmt in enumerate(itertools.takewhile(
        lambda s: not isinstance(s, _COMPOUND), body)) if isinstance(stmt, (ast.Import,
                                                                           ast.ImportFrom))]
    if not imports:
        return _Source(forwards, dispatching, None, line_ends, -1, None)
    tokens = tokenize.generate_tokens(io.StringIO(source_text).readline)
    indent = next((t.string for t in tokens if t.type == tokenize.INDENT), None)
    return _Source(forwards, dispatching, tuple(statements), line_ends,
                   line_ends[last_line(imports[-1]) - 1], indent)


@functools.lru_cache(maxsize=256)
def _parse_segment(text: str) -> cst.Module:
    """libcst's tree of some whole top-level statements (immutable: safe to share between
    generates of one family in a process; ~35 kB retained per statement, ~20 a family)."""
    return cst.parse_module(text)


def _emit_spliced(source_text: str, source: _Source, package: str,
                  rewriter: _RewriteClasses, banner: Sequence[str]) -> str | None:
    """The whole-module transform's text, computed on the few top-level statements it changes.

    The statements either transformer could change (:class:`_Statement`) are parsed,
    transformed and rendered by libcst; every other byte is the source's (libcst round-trips
    untouched text exactly, so the whole-module transform keeps those bytes too). The runtime
    import goes where :func:`_add_runtime_import` puts it: after the last top-level import
    line before the first def/class. Returns None (the caller runs :func:`_emit_whole`) where
    the two could differ (see :class:`_Source`, and a segment whose detected indent is not
    the module's: libcst indents new blocks by the module's).
    """
    if source.statements is None:
        return None
    regions: list[_Statement] = []
    for stmt in source.statements:
        planned = not stmt.classes.isdisjoint(rewriter.plans)
        if not (stmt.relative or planned):
            continue
        stmt = _Statement(stmt.first, stmt.last, stmt.relative,
                          stmt.classes if planned else frozenset())
        if regions and stmt.first <= regions[-1].last:  # statements sharing a line
            prev = regions.pop()
            stmt = _Statement(prev.first, max(prev.last, stmt.last),
                              prev.relative or stmt.relative, prev.classes | stmt.classes)
        regions.append(stmt)
    absolute = _AbsoluteImports(package)
    ends = source.line_ends
    pieces = [_banner_code(banner)]
    at = source.import_at  # never inside a region: it ends a top-level logical line
    done = 0  # the source offset written so far
    for region in [*regions, None]:
        start = (len(source_text) if region is None
                 else ends[region.first - 2] if region.first > 1 else 0)
        if done <= at <= start:
            pieces += [source_text[done:at], RUNTIME_IMPORT]
            done, at = at, -1
        if region is None:
            break
        segment = _parse_segment(source_text[start:ends[region.last - 1]])
        if source.indent is not None and segment.default_indent != source.indent:
            return None
        if region.relative:
            segment = segment.visit(absolute)
        if region.classes:
            segment = segment.visit(rewriter)
        pieces += [source_text[done:start], segment.code]
        done = ends[region.last - 1]
    pieces.append(source_text[done:])
    return "".join(pieces)


def _banner_code(banner: Sequence[str]) -> str:
    """The text the spliced module starts with: the banner and the blank line under it."""
    return cst.Module(body=[], header=_banner_header(banner)).code


@functools.lru_cache(maxsize=64)
def _spliced_after_banner(source_text: str, package: str,
                          plans: tuple[tuple[str, ClassPlan], ...]
                          ) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """:func:`_emit_spliced`'s text after the banner, and the forms it emitted; None where
    it declines.

    Memoized: everything after the banner is a function of the source, its package and the
    class plans alone (the banner names the config and the signature, so it is the one part
    that changes from layout to layout), and generate emits one transformers file with the
    same class forms for every tp, sp or recipe variant it generates of a family in a
    process (~0.1 s of libcst each). Errors (PlanError) are raised, never kept."""
    source = _read_source(source_text)
    rewriter = _RewriteClasses(dict(plans), source.forwards, set(source.dispatching))
    text = _emit_spliced(source_text, source, package, rewriter, ())
    if text is None:
        return None
    head = _banner_code(())
    return text[len(head):], tuple(rewriter.done.items())


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
    package = module_name.rsplit(".", 1)[0]
    # class plans are frozen dataclasses of tuples (hashable): the memo's key
    spliced = _spliced_after_banner(source_text, package, tuple(sorted(plans.items())))
    if spliced is not None:
        return _banner_code(banner) + spliced[0], dict(spliced[1])
    source = _read_source(source_text)
    rewriter = _RewriteClasses(plans, source.forwards, set(source.dispatching))
    text = _emit_whole(source_text, package, rewriter, banner)
    return text, dict(rewriter.done)
