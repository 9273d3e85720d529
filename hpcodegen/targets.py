"""The injection-target registry: the one place where a meta's ``_target_`` names resolve.

A frozen plan may name callables (``local_compute_fn``, ``inner_wrapper``) that the runtime
calls on the model. Importing whatever dotted path a JSON file names would run code nobody
checked (``os.system``, ``subprocess.Popen``, any module's import side effects), so a name
resolves through this registry only, never by importing it as a path:

1. :data:`BUILTIN_TARGETS`: the factories hpcodegen ships, ``name -> "module:attribute"``;
2. entry points of group ``hpcodegen.injection_targets`` (installed packages you trust);
3. prefixes the user trusts explicitly: ``--allow-target PREFIX`` on ``verify`` and
   ``launch``, ``allowed_target_prefixes=`` in the library. Only these are imported by path.

A meta the existing system wrote (no hpcodegen generator stamp) names that system's own
factories (``hyper_parallel.…``), which its runtime imports from its own package. ``verify``
and ``inspect-plan`` cannot read that code but know whose it is: such a target is a warning
(the plan itself is still checked), never silently trusted. The runtime refuses it like any
other name outside the registry unless the user trusts the package (``--allow-target
hyper_parallel``): nothing foreign is imported without an explicit word.

A target matches an entry by the entry's name or by its full dotted path
(``"module:attr"`` read as ``module.attr``). Deciding membership imports nothing (entry
points are read from package metadata), so ``verify`` reports a target outside the registry
at its JSON pointer without running any code; the runtime calls :func:`check_targets`
before any artifact code is imported, then :func:`resolve_injections`.

To ship a factory, add one line to :data:`BUILTIN_TARGETS`, e.g.::

    "sdpa_hf": "hpcodegen.runtime.cp.wrappers:sdpa_hf",

The factory is called ``factory(module, **kwargs)`` with the target's other keys as kwargs.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import reduce
from typing import TYPE_CHECKING, Any

from hpcodegen.entry_points import entry_point_group
from hpcodegen.errors import Finding, PlanError, UsageError, error, pointer, warning
from hpcodegen.plan.types import Plan, Target

if TYPE_CHECKING:
    from hpcodegen.artifact.load import LoadedMeta

ENTRY_POINT_GROUP = "hpcodegen.injection_targets"

#: Injection fields that name a callable (a ``{"_target_": name, **kwargs}`` dict or a name).
TARGET_FIELDS: tuple[str, ...] = ("local_compute_fn", "inner_wrapper")

#: The factories hpcodegen ships: target name -> ``"module:attribute"``. One line each.
BUILTIN_TARGETS: dict[str, str] = {
    "ep_dispatch": "hpcodegen.runtime.moe:ep_dispatch",
    # context-parallel attention (all-gather K/V over cp): hpcodegen's, under the existing
    # system's registry names for the same algorithm, and its dotted targets
    "sdpa_hf": "hpcodegen.runtime.cp.wrappers:sdpa_hf",
    "sdpa_qkv": "hpcodegen.runtime.cp.wrappers:sdpa_qkv",
    "eager_hf": "hpcodegen.runtime.cp.wrappers:eager_hf",
    "hyper_parallel.codegen.inner.sdpa_hf": "hpcodegen.runtime.cp.wrappers:sdpa_hf",
    "hyper_parallel.codegen.inner.sdpa_qkv": "hpcodegen.runtime.cp.wrappers:sdpa_qkv",
    # Ulysses (all-to-all) and the hybrid, under the existing system's names for them
    **{f"{home}{kernel}_{method}": f"hpcodegen.runtime.cp.wrappers:{kernel}_{method}"
       for method in ("ulysses", "hybrid")
       for kernel in ("sdpa_hf", "sdpa_qkv", "eager_hf")
       for home in ("", "hyper_parallel.codegen.inner.") if home == "" or kernel != "eager_hf"},
    "sharded_rms_norm": "hpcodegen.runtime.norms:sharded_rms_norm",
}

#: Top-level packages of the generator that wrote foreign metas: their targets are that
#: system's own factories (a warning in verify and inspect-plan, refused at run time unless
#: trusted). Metas hpcodegen wrote never name them.
FOREIGN_SYSTEM_PACKAGES: tuple[str, ...] = ("hyper_parallel",)

#: A target name or trusted prefix: identifiers joined by dots, nothing else.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_MAX_NAME = 512


def is_target_name(text: object) -> bool:
    """A dotted identifier of sane length (``sdpa_hf``, ``pkg.mod.factory``)."""
    return isinstance(text, str) and len(text) <= _MAX_NAME and _NAME.fullmatch(text) is not None


def trusted_prefixes(prefixes: Iterable[str] | str) -> tuple[str, ...]:
    """Validate ``--allow-target`` values; UsageError for anything but a dotted identifier.

    A trailing dot is accepted (``mypkg.`` = ``mypkg``). An empty prefix would trust every
    importable module, so it is refused rather than read as "allow all".
    """
    if isinstance(prefixes, str):
        prefixes = (prefixes,)
    out: list[str] = []
    for prefix in prefixes:
        bare = prefix[:-1] if isinstance(prefix, str) and prefix.endswith(".") else prefix
        if not is_target_name(bare):
            raise UsageError([error("usage.allow_target", "--allow-target",
                                    f"{prefix!r} is not a module prefix",
                                    expected="a dotted identifier such as mypkg or mypkg.ops")])
        out.append(bare)
    return tuple(out)


def _dotted(spec: str) -> str:
    return spec.replace(":", ".")


def registry() -> dict[str, str]:
    """Every registered name, and every registered dotted path, -> ``"module:attribute"``.

    Built-ins win over entry points of the same name. Reads package metadata only.
    """
    out: dict[str, str] = {}
    for name, spec in BUILTIN_TARGETS.items():
        out.setdefault(name, spec)
        out.setdefault(_dotted(spec), spec)
    for ep in entry_point_group(ENTRY_POINT_GROUP):
        out.setdefault(ep.name, ep.value)
        out.setdefault(_dotted(ep.value), ep.value)
    return out


def target_spec(name: str, prefixes: Iterable[str] = (),
                known: Mapping[str, str] | None = None) -> str | None:
    """The ``"module:attribute"`` a target name resolves to, or None; imports nothing."""
    if not is_target_name(name):
        return None
    spec = (registry() if known is None else known).get(name)
    if spec is not None:
        return spec
    for prefix in prefixes:
        if "." in name and (name == prefix or name.startswith(prefix + ".")):
            module, _, attr = name.rpartition(".")
            return f"{module}:{attr}"
    return None


def iter_targets(meta: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """``(JSON pointer, target name)`` for every target field of ``meta.injections``.

    The name is whatever the meta holds (it may be no string at all); shapes that are not
    injection records are skipped (the schema check reports them).
    """
    injections = meta.get("injections")
    for i, record in enumerate(injections if isinstance(injections, list) else ()):
        if not isinstance(record, Mapping):
            continue
        for key in TARGET_FIELDS:
            value = record.get(key)
            if value is None:  # absent, as the runtime reads it
                continue
            if isinstance(value, Mapping):
                yield pointer("injections", i, key, "_target_"), value.get("_target_")
            else:
                yield pointer("injections", i, key), value


def _foreign_system_target(name: object, foreign_meta: bool) -> bool:
    """A factory of the system that wrote this (foreign) meta, e.g. ``hyper_parallel.…``."""
    return (isinstance(name, str) and name.split(".", 1)[0] in FOREIGN_SYSTEM_PACKAGES
            and "." in name and foreign_meta)


def target_findings(loaded: LoadedMeta, prefixes: Iterable[str] = (), *,
                    to_run: bool = False) -> list[Finding]:
    """A finding for every target outside the registry, at its JSON pointer; imports nothing.

    The targets are read off the JSON as it is (:func:`iter_targets`: a record the codec
    would refuse still names its target), not off the typed plan. Errors, except a foreign
    meta's own-system factory (:data:`FOREIGN_SYSTEM_PACKAGES`), which is a warning for the
    gate and an error when the targets are about to run (``to_run``): the runtime imports
    nothing the user did not trust.
    """
    from hpcodegen.artifact.digest import is_hpcodegen_meta

    prefixes = tuple(prefixes)
    known: Mapping[str, str] | None = None  # read on the first target (most metas have none)
    out: list[Finding] = []
    foreign: bool | None = None
    for where, name in iter_targets(loaded.data):
        if known is None:
            known = registry()
        if target_spec(name, prefixes, known) is not None:
            continue
        shown = name if isinstance(name, str) and len(name) <= 200 else None
        if foreign is None:
            foreign = not is_hpcodegen_meta(loaded.data)
        if not to_run and _foreign_system_target(name, foreign):
            package = name.split(".", 1)[0]
            out.append(warning(
                "plan.foreign_system_target", where,
                f"injection target {shown!r} is a factory of the system that wrote this meta "
                f"({package}); its code is not checkable here and hpcodegen runs it only if "
                f"you trust that package",
                hint=f"to run it: --allow-target {package} (allowed_target_prefixes= in "
                     f"Python), with {package} installed"))
            continue
        out.append(_unregistered(where, name))
    return out


def _unregistered(where: str, name: object) -> Finding:
    """The error for a target outside the registry and the trusted prefixes."""
    shown = name if isinstance(name, str) and len(name) <= 200 else None
    hint = (f"if you trust it, pass --allow-target {shown.rpartition('.')[0]} "
            f"(allowed_target_prefixes= in Python)" if shown and "." in shown
            else f"register it under entry point group {ENTRY_POINT_GROUP}")
    return error("plan.foreign_target", where,
                 f"injection target {shown!r} is not in the injection registry"
                 if shown is not None else
                 f"injection target is not a registered name ({type(name).__name__})",
                 expected="a name hpcodegen registers, an entry point of group "
                          f"{ENTRY_POINT_GROUP}, or a path under --allow-target",
                 hint=hint)


def check_targets(loaded: LoadedMeta, prefixes: Iterable[str] = ()) -> None:
    """Raise PlanError for any target outside the registry (before any code is imported)."""
    found = target_findings(loaded, trusted_prefixes(tuple(prefixes)), to_run=True)
    if found:
        raise PlanError(found)


def _load(spec: str, where: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    try:
        found = reduce(getattr, attr.split("."), importlib.import_module(module_name))
    except (ImportError, AttributeError) as exc:
        raise PlanError([error("runtime.missing_target", where,
                               f"cannot load injection target {spec!r}: {exc}")]) from None
    if not callable(found):
        raise PlanError([error("runtime.bad_target", where, f"{spec!r} is not callable")])
    return found


def resolve_injections(plan: Plan, prefixes: Iterable[str] = ()
                       ) -> dict[str, dict[str, tuple[Callable[..., Any], dict[str, Any]]]]:
    """``{fqn: {field: (factory, kwargs)}}`` for every injection target of ``plan``.

    Checks every target first (the rule of :func:`check_targets`, on the typed records),
    then loads each through its registry spec. Only registered modules and modules under a
    trusted prefix are imported.
    """
    from hpcodegen.plan.frozen import thaw_json

    prefixes = trusted_prefixes(tuple(prefixes))
    known = registry()
    found = [_unregistered(pointer("injections", i, key, *(("_target_",) if isinstance(
                 value, Target) else ())), _target_name(value))
             for i, record in enumerate(plan.injections or ())
             for key, value in record.targets.items()
             if target_spec(_target_name(value), prefixes, known) is None]
    if found:
        raise PlanError(found)
    out: dict[str, dict[str, tuple[Callable[..., Any], dict[str, Any]]]] = {}
    for fqn, record in plan.injections_by_fqn().items():
        for key, value in record.targets.items():
            kwargs = thaw_json(value.kwargs) if isinstance(value, Target) else {}
            spec = target_spec(_target_name(value), prefixes, known)
            assert spec is not None  # checked above
            out.setdefault(fqn, {})[key] = (_load(spec, f"injections[{fqn}].{key}"), kwargs)
    return out


def _target_name(value: Target | str) -> str:
    """The registered name or dotted path a typed target names."""
    return value.path if isinstance(value, Target) else value


__all__ = ["BUILTIN_TARGETS", "ENTRY_POINT_GROUP", "FOREIGN_SYSTEM_PACKAGES", "TARGET_FIELDS",
           "check_targets",
           "is_target_name", "registry", "resolve_injections", "target_findings",
           "target_spec", "trusted_prefixes"]
