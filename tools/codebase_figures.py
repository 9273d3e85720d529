"""Measure the codebase figures issue 33 tracks, by reading the source with ``ast``.

Why: the generate redesign is judged by numbers (how many functions still take the raw meta
dict, how many private names cross package lines, how flat ``generate/`` is, how much code is
written twice, how many placement strings live outside the plan's codec). Counting them by
hand drifts; this script counts them the same way every time, so docs/design.md can quote a
"before" and an "after" measured by one rule.

Library code is every ``.py`` file under ``hpcodegen/`` and ``cli/`` (tests, bench, tools,
examples and generated modules are not library code). The figures:

``raw_meta_fns``
    Functions (``def``/``async def``, methods and nested functions included) with at least one
    parameter that holds the raw meta dict: a parameter named ``meta``, ``raw_meta``,
    ``meta_dict`` or ending in ``_meta``, whose annotation is missing, ``Any``, or a dict type
    (``dict``, ``Dict``, ``Mapping``, ``MutableMapping``, subscripted or not, bare or qualified,
    e.g. ``Mapping[str, Any]``). A parameter annotated with a typed object
    (``meta: LoadedMeta``, ``meta: Plan``) does not count: that is the standard.
``private_cross_imports``
    Private names (one leading underscore, not dunder) taken from an ``hpcodegen``/``cli``
    module by a module of another package: ``from hpcodegen.a.b import _x`` in a module whose
    package is not ``hpcodegen.a``, and ``mod._x`` attribute reads where ``mod`` was imported
    from another package. A module's package is the dotted folder holding it (for
    ``hpcodegen/a/__init__.py`` that is ``hpcodegen.a`` itself). Each (module, name) counts once.
``generate_top_modules``
    ``.py`` files directly in ``hpcodegen/generate/``, ``__init__.py`` excluded.
``dup_blocks_6``
    Places where six or more consecutive normalised lines of library code stand again
    elsewhere. Normalising: leading/trailing white space stripped, inner runs folded to one
    space; blank lines, comments, docstrings, import lines and lines of punctuation only
    (``)``, ``],`` ...) dropped. Every window of six normalised lines is hashed; a window whose
    hash occurs at another place (another file, or a non-overlapping spot in the same file)
    marks its lines duplicated, and each maximal run of marked lines in a file is one place.
    So one copied block counts 2 (the original and its copy).
``placement_literals``
    String literals (docstrings excluded) outside the placement grammar and the plan's codec
    (``hpcodegen/placement.py``, ``hpcodegen/plan/codec.py``) that spell a placement: a whole
    string ``R``, ``S(n)``, ``SS(d,f)``, ``P(op)``, a placement class name (``Replicate``,
    ``Shard``, ``Partial``, ``_StridedShard``), or an f-string whose text starts ``S(``,
    ``SS(`` or ``P(``.

Run ``python tools/codebase_figures.py [ROOT]``; it prints one line
``figures: raw_meta_fns=.. private_cross_imports=.. generate_top_modules=.. dup_blocks_6=..
placement_literals=..`` and, with ``--details``, what each figure counted.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

LIBRARY_ROOTS = ("hpcodegen", "cli")
CODEC_FILES = frozenset({"hpcodegen/placement.py", "hpcodegen/plan/codec.py"})
WINDOW = 6

_META_NAMES = frozenset({"meta", "raw_meta", "meta_dict"})
_DICT_TYPES = frozenset({"dict", "Dict", "Mapping", "MutableMapping", "Any"})
_PLACEMENT_RE = re.compile(
    r"^(R|S\(-?\d+\)|SS\(-?\d+, ?-?\d+\)|P\(\w+\)|Replicate|Shard|Partial|_StridedShard)$")
_PLACEMENT_HEADS = ("S(", "SS(", "P(")
_PUNCTUATION_ONLY = re.compile(r"^[\s()\[\]{},:;.]*$")


@dataclass
class Figures:
    """The five figures and, for ``--details``, what each one counted."""

    raw_meta_fns: list[str] = field(default_factory=list)
    private_cross_imports: list[str] = field(default_factory=list)
    generate_top_modules: list[str] = field(default_factory=list)
    dup_blocks_6: list[str] = field(default_factory=list)
    placement_literals: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The one summary line."""
        return ("figures: " + " ".join(f"{name}={len(getattr(self, name))}" for name in (
            "raw_meta_fns", "private_cross_imports", "generate_top_modules",
            "dup_blocks_6", "placement_literals")))


def library_files(root: Path) -> list[Path]:
    """Every library ``.py`` file under ``root`` (sorted, caches and venvs skipped)."""
    out: list[Path] = []
    for top in LIBRARY_ROOTS:
        base = root / top
        if base.is_dir():
            out.extend(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)
    return sorted(out)


def module_name(root: Path, path: Path) -> str:
    """The dotted module name of ``path`` (``hpcodegen/a/b.py`` -> ``hpcodegen.a.b``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(root: Path, path: Path) -> str:
    """The package holding ``path``: its folder, dotted."""
    return ".".join(path.relative_to(root).parent.parts)


def _annotation_is_dict(node: ast.expr | None) -> bool:
    if node is None:
        return True
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr in _DICT_TYPES
    return isinstance(node, ast.Name) and node.id in _DICT_TYPES


def _is_meta_name(name: str) -> bool:
    return name in _META_NAMES or name.endswith("_meta")


def raw_meta_functions(tree: ast.AST, rel: str) -> Iterator[str]:
    """``rel:line name`` for each function with a raw-meta parameter (see the module doc)."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        if any(_is_meta_name(a.arg) and _annotation_is_dict(a.annotation) for a in params):
            yield f"{rel}:{node.lineno} {node.name}"


def _resolve(module: str | None, level: int, importer: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, *([module] if module else [])])


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _source_package(root: Path, module: str) -> str:
    """The package a dotted library module lives in (its folder)."""
    path = root.joinpath(*module.split("."))
    if path.is_dir():
        return module
    return module.rpartition(".")[0]


def private_cross_imports(tree: ast.AST, root: Path, path: Path) -> Iterator[str]:
    """``importer -> source.name`` for each private name crossing a package line."""
    importer = module_name(root, path)
    own = package_of(root, path)
    is_package = path.name == "__init__.py"
    aliases: dict[str, str] = {}
    seen: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(node.module, node.level, importer, is_package)
            if source.split(".")[0] not in LIBRARY_ROOTS:
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if root.joinpath(*full.split(".")).with_suffix(".py").is_file() or \
                        root.joinpath(*full.split(".")).is_dir():
                    aliases[alias.asname or alias.name] = full
                    continue
                if _is_private(alias.name) and _source_package(root, source) != own:
                    seen.add(f"{importer} -> {source}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARY_ROOTS and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in aliases:
                source = aliases[base.id]
                if _source_package(root, source) != own:
                    seen.add(f"{importer} -> {source}.{node.attr}")
    yield from sorted(seen)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                ids.add(id(body[0].value))
    return ids


_DOC_IDS: dict[int, set[int]] = {}


def placement_literals(tree: ast.AST, rel: str) -> Iterator[str]:
    """``rel:line 'text'`` for each placement spelt as a string outside the codec."""
    if rel in CODEC_FILES:
        return
    docs = _DOC_IDS.setdefault(id(tree), _docstring_nodes(tree))
    in_fstring: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            in_fstring.update(id(v) for v in node.values)
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and \
                    head.value.startswith(_PLACEMENT_HEADS):
                yield f"{rel}:{node.lineno} f{head.value!r}..."
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docs and id(node) not in in_fstring and \
                _PLACEMENT_RE.match(node.value):
            yield f"{rel}:{node.lineno} {node.value!r}"


def normalised_lines(text: str, tree: ast.AST) -> list[tuple[int, str]]:
    """(line number, folded text) of the lines that count for copies (see the module doc)."""
    docs = _DOC_IDS.setdefault(id(tree), _docstring_nodes(tree))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if id(node) in docs or isinstance(node, (ast.Import, ast.ImportFrom)):
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    out: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = " ".join(raw.split())
        if number in skip or not line or line.startswith("#") or _PUNCTUATION_ONLY.match(line):
            continue
        out.append((number, line))
    return out


def duplicate_places(files: Iterable[tuple[str, list[tuple[int, str]]]]) -> list[str]:
    """``rel:first-last`` for each maximal run of lines shared with another place."""
    windows: dict[str, list[tuple[str, int]]] = defaultdict(list)
    lines_of: dict[str, list[tuple[int, str]]] = {}
    for rel, lines in files:
        lines_of[rel] = lines
        for start in range(len(lines) - WINDOW + 1):
            chunk = "\n".join(text for _, text in lines[start:start + WINDOW])
            windows[hashlib.sha256(chunk.encode()).hexdigest()].append((rel, start))
    marked: dict[str, set[int]] = defaultdict(set)
    for places in windows.values():
        if len(places) < 2:
            continue
        for rel, start in places:
            others = [p for p in places if p[0] != rel or abs(p[1] - start) >= WINDOW]
            if others:
                marked[rel].update(range(start, start + WINDOW))
    out: list[str] = []
    for rel in sorted(marked):
        idx = sorted(marked[rel])
        run_start = prev = idx[0]
        for i in [*idx[1:], None]:
            if i is not None and i == prev + 1:
                prev = i
                continue
            lines = lines_of[rel]
            out.append(f"{rel}:{lines[run_start][0]}-{lines[prev][0]}")
            if i is not None:
                run_start = prev = i
    return out


def measure(root: Path) -> Figures:
    """All five figures of the tree at ``root``."""
    figures = Figures()
    normalised: list[tuple[str, list[tuple[int, str]]]] = []
    for path in library_files(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=rel)
        figures.raw_meta_fns.extend(raw_meta_functions(tree, rel))
        figures.private_cross_imports.extend(private_cross_imports(tree, root, path))
        figures.placement_literals.extend(placement_literals(tree, rel))
        normalised.append((rel, normalised_lines(text, tree)))
        _DOC_IDS.pop(id(tree), None)
    figures.dup_blocks_6.extend(duplicate_places(normalised))
    gen = root / "hpcodegen" / "generate"
    if gen.is_dir():
        figures.generate_top_modules.extend(
            sorted(p.name for p in gen.glob("*.py") if p.name != "__init__.py"))
    return figures


def main(argv: list[str] | None = None) -> int:
    """Print the figures line (and with ``--details`` what each counted); exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--details", action="store_true", help="list what each figure counted")
    args = parser.parse_args(argv)
    figures = measure(args.root.resolve())
    if args.details:
        for name in ("raw_meta_fns", "private_cross_imports", "generate_top_modules",
                     "dup_blocks_6", "placement_literals"):
            print(f"## {name}")
            for item in getattr(figures, name):
                print(f"  {item}")
    print(figures.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
