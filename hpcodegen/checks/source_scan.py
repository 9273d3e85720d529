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


def _read_from_param(value: ast.expr, params: set[str]) -> str | None:
    """``B`` when ``value`` is ``p.B`` or ``getattr(p, "B"[, default])`` for a parameter ``p``."""
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) \
            and value.value.id in params:
        return value.attr
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
            and value.func.id == "getattr" and len(value.args) >= 2 \
            and isinstance(value.args[0], ast.Name) and value.args[0].id in params \
            and isinstance(value.args[1], ast.Constant) and isinstance(value.args[1].value, str):
        return value.args[1].value
    return None


def kept_attributes(cls: ClassInfo) -> dict[str, str]:
    """``{attr: source attr}`` for each ``self.<attr> = <param>.<source attr>`` in a method.

    A replacement class built from the module it replaces (``__init__(self, *, module)``)
    keeps some of its children as they are (``self.o_proj = module.o_proj``,
    ``self.q_norm = getattr(module, "q_norm", None)``); those are the original's modules, so
    what the plan says below them can be checked against the original. Which reads name a
    child module is for the caller to confirm on the live original.
    """
    out: dict[str, str] = {}
    for func in cls.methods.values():
        a = func.args
        params = {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)} - {"self"}
        for node in ast.walk(func):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target = node.targets[0]
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                    and target.value.id == "self":
                source = _read_from_param(node.value, params)
                if source is not None:
                    out.setdefault(target.attr, source)
    return out
