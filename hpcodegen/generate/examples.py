"""Regenerate every example artifact under ``examples/`` (or check them: the CI gate).

Usage::

    python -m hpcodegen.generate.examples           # rewrite every bundle
    python -m hpcodegen.generate.examples --check   # exit 1 naming each drifted file

Each example is ``(config dir, tp, sp, artifact dir, loss parallel, cp)``, paths relative
to the repository root.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from hpcodegen.generate.api import GenerateArgs, run_generate

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Example:
    """One committed artifact and the inputs it is generated from."""

    config: str
    tp: int
    sp: bool
    out: str
    #: the output head's logits stay vocab-sharded (``generate --loss-parallel``)
    loss_parallel: bool = False
    #: context-parallel degree (``generate --cp``; the layout is the default, head-tail)
    cp: int = 1


EXAMPLES: tuple[Example, ...] = (
    Example("examples/configs/llama", 2, False, "examples/llama_tp2"),
    Example("examples/configs/llama", 2, True, "examples/llama_tp2_sp"),
    Example("examples/configs/llama", 2, True, "examples/llama_tp2_sp_lp", loss_parallel=True),
    Example("examples/configs/llama", 4, False, "examples/llama_tp4"),
    Example("examples/configs/qwen3", 2, False, "examples/qwen3_tp2"),
    Example("examples/configs/qwen3", 2, True, "examples/qwen3_tp2_sp"),
    Example("examples/configs/llama_bias", 2, False, "examples/llama_bias_tp2"),
    Example("examples/configs/llama", 2, True, "examples/llama_cp2_tp2_sp", cp=2),
)


class _Relative:
    """A stdout that prints paths relative to the repository root."""

    def __init__(self, root: Path) -> None:
        self.prefix = f"{root}/"

    def write(self, text: str) -> int:
        return sys.stdout.write(text.replace(self.prefix, ""))


def run_examples(check: bool, root: Path = REPO_ROOT, only: tuple[str, ...] = ()) -> int:
    """Generate (or check) every example; returns the worst exit code."""
    worst = 0
    for ex in EXAMPLES:
        if only and ex.out not in only and Path(ex.out).name not in only:
            continue
        args = GenerateArgs(root / ex.config, ex.tp, root / ex.out, sp=ex.sp, check=check,
                            loss_parallel=ex.loss_parallel, cp=ex.cp)
        code = run_generate(args, stdout=_Relative(root))
        worst = max(worst, code)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcodegen.generate.examples",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate in memory and fail on any byte difference")
    parser.add_argument("only", nargs="*", help="only these artifact dirs (e.g. llama_tp2)")
    ns = parser.parse_args(argv)
    return run_examples(ns.check, only=tuple(ns.only))


if __name__ == "__main__":
    sys.exit(main())
