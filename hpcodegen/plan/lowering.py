"""The emitted-form gates: when a tp_collective verdict is written as a generic forward (pure).

A generated tp_collective forward re-passes the original arguments by name and transforms
``outputs[0]`` (a tuple return) or ``outputs`` (a single value). That is only sound when the
original ``forward`` takes no ``*args``, every ``return`` carries a value of one shape (all
tuple literals or none), every declared input is a named parameter and every lowered output is
the first return value. Otherwise the class is emitted generic.

``generate`` (before its libcst rewrite) and verify's ``source`` check (on the generated
``_forward_impl``, the original forward kept byte-for-byte) both read the forward with
:mod:`ast` into a :class:`ForwardSignature` and ask :func:`lowering_gates`, so the two can
never disagree on the emitted form.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from hpcodegen.plan.classify import BoundaryForm, outputs_not_first

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class ForwardSignature:
    """What the generated forward (and the gates) need to know about the original one."""

    #: positional parameter names, ``self`` dropped
    positional: tuple[str, ...]
    kwonly: tuple[str, ...]
    varargs: str | None
    varkw: str | None
    #: "tuple" when every valued return is a tuple literal, "single" when none is, "mixed" else
    returns: str
    #: a bare ``return`` (no value) somewhere in the body
    bare_return: bool

    @property
    def names(self) -> set[str]:
        """Parameters a caller can pass by name (no ``*args``/``**kwargs``)."""
        return set(self.positional) | set(self.kwonly)


def own_returns(func: FunctionNode) -> list[ast.Return]:
    """``return`` statements of the function itself, not of nested defs, lambdas or classes."""
    found: list[ast.Return] = []
    stack: list[ast.AST] = list(func.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            found.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def forward_signature(func: FunctionNode) -> ForwardSignature:
    """Read the parameters and the shape of the returns of a method (first parameter dropped)."""
    a = func.args
    returns = own_returns(func)
    tuples = [isinstance(r.value, ast.Tuple) for r in returns if r.value is not None]
    shape = "tuple" if tuples and all(tuples) else "single" if not any(tuples) else "mixed"
    return ForwardSignature(
        positional=tuple(x.arg for x in (*a.posonlyargs, *a.args))[1:],
        kwonly=tuple(x.arg for x in a.kwonlyargs),
        varargs=a.vararg.arg if a.vararg else None,
        varkw=a.kwarg.arg if a.kwarg else None,
        returns=shape,
        bare_return=any(r.value is None for r in returns),
    )


def _module(source: str | ast.Module) -> ast.Module:
    """The parsed module: a caller that already parsed the text (the emitter) passes its
    tree so one generate parses the modeling file with :mod:`ast` once."""
    return source if isinstance(source, ast.Module) else ast.parse(source)


def class_forwards(source: str | ast.Module) -> dict[str, ForwardSignature]:
    """Top-level class name -> the signature of the ``forward`` it defines (source text or
    its parsed tree)."""
    out: dict[str, ForwardSignature] = {}
    for node in _module(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == "forward":
                out.setdefault(node.name, forward_signature(stmt))
    return out


#: Class decorators that replace ``forward`` by a dispatcher when the class is created
#: (transformers' ``use_experts_implementation`` picks eager / grouped_mm / ... kernels and
#: never calls a rewritten ``forward`` for the fast ones).
FORWARD_DISPATCH_DECORATORS = frozenset({"use_experts_implementation"})


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def dispatching_class(node: ast.ClassDef) -> bool:
    """True when a class decorator replaces ``forward`` (see FORWARD_DISPATCH_DECORATORS)."""
    return any(_decorator_name(d) in FORWARD_DISPATCH_DECORATORS for d in node.decorator_list)


def instance_wrapped(form: str, cls: ast.ClassDef | None) -> bool:
    """The rule generate and verify share: is this boundary class left untouched in the file
    and wrapped per instance at run time (like ``nn.Linear``)?

    Yes for a class not in the file; for a class whose forward a decorator dispatches (a
    rewritten forward would be bypassed by the kernel it picks); and for a ``region`` (the
    runtime runs inputs -> the injected local compute -> outputs around the instance).
    """
    return cls is None or form == "region" or dispatching_class(cls)


def dispatching_classes(source: str | ast.Module) -> set[str]:
    """Top-level classes of ``source`` (text or parsed tree) whose forward a decorator
    dispatches."""
    return {node.name for node in _module(source).body
            if isinstance(node, ast.ClassDef) and dispatching_class(node)}


def lowering_gates(form: BoundaryForm, sig: ForwardSignature) -> list[str]:
    """Why a tp_collective verdict is emitted generic (empty: emitted as bare collectives)."""
    reasons = []
    if sig.varargs:
        reasons.append(f"forward takes *{sig.varargs}")
    if sig.bare_return or sig.returns == "mixed":
        reasons.append("forward has returns of different shapes")
    missing = [t.name for t in form.inputs if t.name not in sig.names]
    if missing:
        reasons.append(f"inputs {missing} are not forward parameters")
    later = outputs_not_first(form)
    if later:
        reasons.append(f"outputs {list(later)} are not the first output")
    return reasons
