"""Which optional dependencies a verb needs, and a clear exit 2 when they are missing.

The core install (``pip install hpcodegen``) is the CI gate: verify without a model check,
inspect-plan without a volume, schema. Everything that builds or runs a model needs the
``runtime`` extra (torch, transformers, libcst, pyyaml, safetensors); users install their
own torch build first. A verb that needs a missing extra says which one, before any work.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from hpcodegen.errors import UsageError, error

#: extra name -> the importable modules it provides
EXTRAS: dict[str, tuple[str, ...]] = {
    "runtime": ("torch", "transformers", "libcst", "yaml", "safetensors", "psutil"),
    "hub": ("huggingface_hub",),
}


def missing_modules(modules: Sequence[str]) -> list[str]:
    """The modules of ``modules`` that cannot be imported (found without importing them)."""
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def require(extra: str, what: str, modules: Sequence[str] | None = None,
            alternative: str | None = None) -> None:
    """Raise UsageError (exit 2) naming the extra to install when its modules are missing.

    Args:
        extra: a key of :data:`EXTRAS`.
        what: the feature that needs it, e.g. ``"hpcodegen generate"``.
        modules: the modules this feature uses (default: all of the extra's).
        alternative: another way out, added to the hint (``"or pass --skip model"``).
    """
    missing = missing_modules(modules if modules is not None else EXTRAS[extra])
    if missing:
        hint = f"pip install 'hpcodegen[{extra}]'"
        if extra == "runtime":
            hint += " (install your own torch build first)"
        if alternative:
            hint += f", {alternative}"
        raise UsageError([error(
            "install.missing_extra", extra,
            f"{what} needs the '{extra}' extra (missing: {', '.join(missing)})", hint=hint)])
