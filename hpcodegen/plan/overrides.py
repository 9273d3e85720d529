"""``module_overrides``: which modules of the HF model the artifact replaces (pure).

The existing system swaps whole modules before it shards (norms -> its ``RMSNorm``,
attention -> ``GQAAttention`` with one fused ``linear_qkv``, experts -> grouped experts), and
freezes the plan against the *replaced* model. So below a replaced module, the plan's
parameter names and ``boundary_classes`` describe the replacement, which hpcodegen cannot
build: the factory is foreign code and is never imported.

One record per replaced module (reference, section 3.3), in either naming generation:
``{"fqns": [...], "fqn": ..., "match": [globs], "module_type": dotted class,
"factory": dotted factory, "exact_type": bool}``. The G1 literal groups several FQNs under one
record (``fqns`` only); the runtime replays a record with ``fqns``, else ``fqn``, else the
``match`` globs as the selection, and a glob selects only modules of ``module_type`` (exactly,
with ``exact_type``). Which record a module falls under is decided here, once, for verify's
model check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcodegen.errors import pointer
from hpcodegen.plan.types import Plan


@dataclass(frozen=True)
class Override:
    """One ``module_overrides`` record, read defensively (the schema reports bad shapes)."""

    index: int
    #: explicit FQNs (``fqns``, else ``fqn``); empty when only ``match`` globs select
    fqns: tuple[str, ...]
    globs: tuple[str, ...]
    module_type: str | None
    factory: str | None
    exact_type: bool

    @property
    def where(self) -> str:
        return pointer("module_overrides", self.index)

    @property
    def target(self) -> str:
        """What replaces the module, for messages: the factory, else the record itself."""
        return self.factory or f"module_overrides[{self.index}]"


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)):  # a frozen JSON array is a tuple
        return tuple(v for v in value if isinstance(v, str))
    return ()


def read_overrides(plan: Plan) -> list[Override]:
    """The well-formed part of each ``module_overrides`` record (frozen JSON), in order."""
    out = []
    for i, record in enumerate(plan.module_overrides or ()):
        if not isinstance(record, Mapping):
            continue
        fqns = _strings(record.get("fqns")) or _strings(record.get("fqn"))
        module_type, factory = record.get("module_type"), record.get("factory")
        out.append(Override(
            index=i, fqns=fqns, globs=() if fqns else _strings(record.get("match")),
            module_type=module_type if isinstance(module_type, str) and module_type else None,
            factory=factory if isinstance(factory, str) and factory else None,
            exact_type=record.get("exact_type") is True))
    return out


def class_matches(override: Override, mro: Iterable[tuple[str, str]]) -> bool:
    """Does a module whose class MRO is ``[(module path, qualname), ...]`` have the declared type?

    ``module_type`` is a dotted class path (``transformers.models.x.modeling_x.XAttention``)
    or a bare class name. The class path may move between transformers releases, so the class
    name decides when the dotted path differs. Without ``exact_type`` a subclass matches too.
    """
    if override.module_type is None:
        return True
    want = override.module_type
    want_name = want.rpartition(".")[2]
    classes = list(mro)
    for module, qualname in classes[:1] if override.exact_type else classes:
        if f"{module}.{qualname}" == want or qualname == want_name:
            return True
    return False


def replaced_modules(overrides: Iterable[Override], modules: Mapping[str, Any],
                     mro_of: Any) -> dict[str, Override]:
    """``{replaced module FQN: its record}`` over the live model's ``modules`` (FQN -> module).

    Explicit FQNs are taken as declared (whether they exist is the caller's check); globs
    select the modules they match whose class is ``module_type`` (``mro_of(module)`` gives the
    ``[(module path, qualname)]`` MRO). A module named by two records keeps the first.
    """
    import fnmatch  # only the model check selects by glob

    out: dict[str, Override] = {}
    for override in overrides:
        if override.fqns:
            for fqn in override.fqns:
                out.setdefault(fqn, override)
            continue
        for fqn, module in modules.items():
            if fqn and any(fnmatch.fnmatchcase(fqn, g) for g in override.globs) \
                    and class_matches(override, mro_of(module)):
                out.setdefault(fqn, override)
    return out


def replaced_by(fqn: str, replaced: Mapping[str, Override]) -> str | None:
    """The replaced module at or above ``fqn`` (the outermost one), or None."""
    parts = fqn.split(".") if fqn else []
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix in replaced:
            return prefix
    return None
