"""Move ``hpcodegen/generate/*.py`` into stage folders and rewrite every reference to them.

Why: ``generate/`` grew to 40-odd flat modules; a newcomer should read it in the order a run
goes (issue 33): where plans come from, seeds, layouts, checks, emit, publish. Other work
changes these modules at the same time, so the move is a script, re-run after every merge,
not a hand edit: it ``git mv``s each module still at the top into its stage (a module already
moved is left alone) and rewrites the references in every tracked text file, so running it
twice changes nothing the second time.

What it rewrites (tracked ``.py``, ``.md``, ``.toml``, ``.cfg``, ``.txt``, ``.yml``/``.yaml``
files and the Makefile; generated examples and fixtures' bundles are data and are left
alone):

* dotted paths ``hpcodegen.generate.X[.attr]`` -> ``hpcodegen.generate.<stage>.X[.attr]``;
* ``from hpcodegen.generate import X, Y`` -> one ``from hpcodegen.generate.<stage> import``
  per stage (names that stay at the top keep their line);
* file paths ``[hpcodegen/]generate/X.py`` -> ``[hpcodegen/]generate/<stage>/X.py``.

After the move a stage package is named as a folder (``generate/seeds/``) or imported from by
its modules' names (``from hpcodegen.generate.seeds import seeds``); a bare dotted
``hpcodegen.generate.seeds`` is read as the module of that name, as it was before the move.

A module not named in :data:`STAGES` stays at the top (``api``, ``examples``: the steps in
order, and the dev-only example regenerator ``setup.py`` leaves out of the wheel); so does
the YAML data package ``rules/``. Usage: ``python tools/restage_generate.py [--dry-run]``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GENERATE = Path("hpcodegen") / "generate"

#: stage -> (its docstring, its modules), in the order a run goes
STAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sources": (
        "Where a plan comes from: transformers' own TP plan, the package rules, the user's\n"
        "recipe, the generation record ``--check`` reads back, and the glob and style\n"
        "vocabulary they are written in.",
        ("plan_sources", "hf_plan", "package_rules", "recipe", "recorded", "globs", "styles")),
    "seeds": (
        "Megatron's layout found where no plan names a layer: from the module tree\n"
        "(``seeds``), the traced dataflow (pair and attention seeds, checked on one rank's\n"
        "heads) and fused projections' row order (read off the traced forward, checked on a\n"
        "rank's copy); ``module_facts`` is what a module's class and forward say.",
        ("seeds", "attention_seeds", "pair_seeds", "head_check", "fused_seeds", "fused_rows",
         "fused_rank", "module_facts")),
    "layouts": (
        "From styles to boundary entries: Megatron's layouts, the Lifter and its entries, the\n"
        "MoE experts, tied and unplanned parameters, and the axes added on top (``--cp``,\n"
        "``--pp``, ``--sp``'s token dims); ``cost`` prices a kept plan.",
        ("layouts", "lift", "entries", "moe_entry", "experts", "tied", "unplanned",
         "megatron_shape", "cost", "cp_plan", "cp_method", "cp_probe", "pipeline",
         "token_dims")),
    "checks": (
        "What a plan must pass before it is frozen: coverage and divisibility, a split layer,\n"
        "``--sp`` running on a sharded sequence and its nesting rule, and verify's own checks\n"
        "on the meta about to be written.",
        ("validate", "layer_split", "sp_check", "sp_nesting", "frozen_check")),
    "emit": (
        "The bundle's bytes: the frozen meta fields and the generated modeling module (the\n"
        "libcst emitter over transformers' source, forward bodies, banner and diff).",
        ("freeze", "emit", "modeling_text", "forward_text", "source")),
    "publish": (
        "Writing the bundle to ``-o`` and reporting generate's result.",
        ("publish",)),
}

STAGE_OF: dict[str, str] = {mod: stage for stage, (_doc, mods) in STAGES.items()
                            for mod in mods}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".cfg", ".txt", ".yml", ".yaml"}
SKIP_PREFIXES = ("examples/", "tests/fixtures/golden/", "tests/fixtures/artifacts/",
                 "tools/restage_generate.py", "tests/tools/test_restage_generate.py")

_DOTTED = re.compile(r"\bhpcodegen\.generate\.(\w+)(\.\w+)?")
_FROM = re.compile(r"^(?P<indent>[ \t]*)from hpcodegen\.generate import (?P<names>[\w ,]+?)"
                   r"(?P<tail>[ \t]*(#.*)?)$", re.M)
_PATH = re.compile(r"(?<![\w/])((?:hpcodegen/)?generate/)(\w+)\.py\b")


_IMPORTED = re.compile(r"[ \t]+import[ \t]+(\(([^)]*)\)|[\w ,]+)")


def _imports_stage_modules(match: re.Match[str], stage: str) -> bool:
    """``from hpcodegen.generate.<stage> import m1, m2`` naming only the stage's modules."""
    tail = _IMPORTED.match(match.string, match.end())
    if tail is None:
        return False
    names = [n.split(" as ")[0].strip() for n in (tail.group(2) or tail.group(1)).split(",")]
    return all(n in STAGES[stage][1] for n in names if n)


def _dotted(match: re.Match[str]) -> str:
    first, rest = match.group(1), match.group(2) or ""
    if first in STAGES and (rest[1:] in STAGES[first][1] or (
            not rest and _imports_stage_modules(match, first))):
        return match.group(0)  # already staged
    if first not in STAGE_OF:
        return match.group(0)
    return f"hpcodegen.generate.{STAGE_OF[first]}.{first}{rest}"


def _from(match: re.Match[str]) -> str:
    indent, tail = match.group("indent"), match.group("tail")
    names = [n.strip() for n in match.group("names").split(",") if n.strip()]
    groups: dict[str, list[str]] = {}
    for name in names:
        base = name.split(" as ")[0].strip()
        groups.setdefault(STAGE_OF.get(base, ""), []).append(name)
    if set(groups) == {""}:
        return match.group(0)
    lines = []
    for stage, items in groups.items():
        where = f"hpcodegen.generate.{stage}" if stage else "hpcodegen.generate"
        lines.append(f"{indent}from {where} import {', '.join(items)}")
    lines[-1] += tail
    return "\n".join(lines)


def _path(match: re.Match[str]) -> str:
    prefix, name = match.group(1), match.group(2)
    if name not in STAGE_OF:
        return match.group(0)
    return f"{prefix}{STAGE_OF[name]}/{name}.py"


def rewrite(text: str) -> str:
    """``text`` with every reference to a moved module pointing into its stage."""
    text = _FROM.sub(_from, text)
    text = _DOTTED.sub(_dotted, text)
    return _PATH.sub(_path, text)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout


def move_modules(dry_run: bool) -> list[str]:
    """``git mv`` every staged module still at generate's top; the stage folders' inits."""
    moved = []
    for stage, (doc, mods) in STAGES.items():
        folder = REPO / GENERATE / stage
        init = folder / "__init__.py"
        for mod in mods:
            src = REPO / GENERATE / f"{mod}.py"
            if not src.is_file():
                continue
            moved.append(f"{mod} -> {stage}")
            if dry_run:
                continue
            folder.mkdir(exist_ok=True)
            _git("mv", str(src.relative_to(REPO)), str((folder / f"{mod}.py").relative_to(REPO)))
        if not dry_run and folder.is_dir() and not init.is_file():
            init.write_text(f'"""{doc}\n"""\n', encoding="utf-8")
            _git("add", str(init.relative_to(REPO)))
    return moved


def rewrite_tree(dry_run: bool) -> list[str]:
    """Rewrite every tracked text file; the paths that changed."""
    changed = []
    for rel in _git("ls-files").splitlines():
        path = REPO / rel
        if rel.startswith(SKIP_PREFIXES) or not path.is_file() or (
                path.suffix not in TEXT_SUFFIXES and path.name != "Makefile"):
            continue
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        if new != text:
            changed.append(rel)
            if not dry_run:
                path.write_text(new, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    """Move, then rewrite; prints what it did (nothing on a second run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="say what would change")
    args = parser.parse_args(argv)
    moved = move_modules(args.dry_run)
    changed = rewrite_tree(args.dry_run)
    for line in moved:
        print(f"moved {line}")
    for rel in changed:
        print(f"rewrote {rel}")
    top = sorted(p.name for p in (REPO / GENERATE).glob("*.py") if p.name != "__init__.py")
    print(f"restage: {len(moved)} moved, {len(changed)} files rewritten; "
          f"generate/ top: {len(top)} modules ({', '.join(top)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
