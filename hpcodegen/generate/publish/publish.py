"""Writing the bundle to ``-o`` and reporting generate's result as text.

Split out of :mod:`hpcodegen.generate.api`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from hpcodegen.artifact.bundle import BundleTargetError, check_target, write_bundle
from hpcodegen.errors import Finding, UsageError, error

if TYPE_CHECKING:
    from hpcodegen.generate.api import GenerateArgs


def locate(finding: Finding, config_path: Path, recipe: Path | None) -> Finding:
    """Name the file a JSON pointer is in: the recipe for ``recipe.*``, else the config."""
    if finding.file or not finding.where.startswith("/"):
        return finding
    owner = recipe if finding.code.startswith("recipe.") else config_path
    return replace(finding, file=os.fspath(owner)) if owner is not None else finding


def publish(out: Path, rendered: Mapping[str, bytes] | None) -> None:
    """Write the bundle to ``-o`` (only check the target when ``rendered`` is None).

    A target that is a file or a foreign directory, or a path that cannot be created, is a
    usage error naming ``-o``.
    """
    try:
        if rendered is None:
            check_target(out)
        else:
            write_bundle(out, rendered)
    except BundleTargetError as exc:
        raise UsageError([error("generate.out_not_bundle", "-o", str(exc))]) from None
    except OSError as exc:
        raise UsageError([error("generate.out_unwritable", "-o",
                                f"cannot write {os.fspath(out)}: {exc.strerror or exc}"
                                + (f" ({exc.filename})" if exc.filename else ""))]) from None


def report_text(args: GenerateArgs, rendered: Mapping[str, bytes], signature: str,
                 drifted: Sequence[str], stdout: TextIO) -> None:
    from hpcodegen.report.terminal import fold_text, human_bytes

    out = os.fspath(args.out)
    for line in drifted:  # drift is the result: printed even with --quiet
        stdout.write(fold_text(f"{out}/{line}") + "\n")
    if args.verbosity < 0:
        return
    if args.check and not drifted:
        stdout.write(fold_text(f"{out}: up to date") + "\n")
    elif not args.check:
        stdout.write(fold_text(f"wrote {out} (signature {signature})") + "\n")
    if args.verbosity > 0:
        for name, data in sorted(rendered.items()):
            stdout.write(fold_text(f"  {name}  {human_bytes(len(data))}") + "\n")
