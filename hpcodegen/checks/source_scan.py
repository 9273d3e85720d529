"""A static picture of the generated modeling file, read with ``ast`` (never imported).

Only what the ``source`` check compares is collected: top-level names, and per class its
methods, its boundary-form marker and the ``self.<attr>`` names its ``forward`` touches.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from hpcodegen.plan.entry import FORM_MARKERS


@dataclass
class ClassInfo:
    """One top-level class of the modeling file."""

    name: str
    line: int
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    #: marker attribute name -> its constant value (``_hp_boundary_form = "tp_collective"``)
    markers: dict[str, object] = field(default_factory=dict)

    @property
    def marker(self) -> object | None:
        return next(iter(self.markers.values()), None)


@dataclass
class ModuleScan:
    """Top-level classes, functions and every other bound name of the file."""

    classes: dict[str, ClassInfo] = field(default_factory=dict)
    functions: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)


def _assigned_names(node: ast.stmt) -> list[str]:
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _scan_class(node: ast.ClassDef) -> ClassInfo:
    info = ClassInfo(node.name, node.lineno)
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            info.methods[stmt.name] = stmt
        value = getattr(stmt, "value", None)
        for name in _assigned_names(stmt):
            if name in FORM_MARKERS:
                info.markers[name] = value.value if isinstance(value, ast.Constant) else None
    return info


def scan_module(tree: ast.Module) -> ModuleScan:
    """Collect the top-level picture of a parsed module."""
    scan = ModuleScan()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            scan.classes[node.name] = _scan_class(node)
            scan.names.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scan.functions.add(node.name)
            scan.names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            scan.names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            scan.names.update(_assigned_names(node))
    return scan


def self_attrs(func: ast.AST) -> set[str]:
    """Every ``self.<attr>`` read in a function (nested bodies included)."""
    return {
        n.attr for n in ast.walk(func)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }


def called_names(func: ast.AST) -> set[str]:
    """Names and attribute names that are called anywhere in a function."""
    out: set[str] = set()
    for n in ast.walk(func):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name):
                out.add(f.id)
            elif isinstance(f, ast.Attribute):
                out.add(f.attr)
    return out


def _own_returns(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Return]:
    """``return`` statements of the function itself, not of nested defs or lambdas."""
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


def param_names(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Positional and keyword-only parameter names (no ``*args``/``**kwargs``)."""
    a = func.args
    return {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}


def lowering_gates(func: ast.FunctionDef | ast.AsyncFunctionDef,
                   inputs: set[str]) -> list[str]:
    """Why a tp_collective class would be emitted generic (reference, emitted-form gates).

    ``*args`` cannot be re-passed statically; every ``return`` must carry a value; every
    declared input must be a named parameter of the forward.
    """
    reasons = []
    if func.args.vararg is not None:
        reasons.append(f"forward takes *{func.args.vararg.arg}")
    if any(r.value is None for r in _own_returns(func)):
        reasons.append("a return without a value")
    missing = sorted(inputs - param_names(func))
    if missing:
        reasons.append(f"inputs {missing} are not forward parameters")
    return reasons
