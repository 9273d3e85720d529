"""Phase B: special handlers, from a registry of built-ins plus Python entry points.

``meta.special_handlers`` maps ``"<module_fqn>.<param>"`` to a handler name. A handler is
called ``handler(module, param_name, ctx)`` after Phase A, where ``ctx`` is the
:class:`~hpcodegen.runtime.mesh.ActiveMesh`. Third-party handlers register under the entry
point group ``hpcodegen.special_handlers``. An unknown name is a PlanError naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from hpcodegen.entry_points import entry_point_group
from hpcodegen.errors import PlanError, error, pointer
from hpcodegen.plan.types import Plan
from hpcodegen.runtime.grad_sync import install_grad_allreduce
from hpcodegen.runtime.params import split_owner

ENTRY_POINT_GROUP = "hpcodegen.special_handlers"
Handler = Callable[[nn.Module, str, Any], None]


def _grad_allreduce(module: nn.Module, name: str, active: Any) -> None:
    """HF's ``replicated_with_grad_allreduce``: sum the parameter's gradient over tp."""
    install_grad_allreduce(module, [name], active.tp_group())


BUILTIN_HANDLERS: dict[str, Handler] = {
    "grad_allreduce": _grad_allreduce,
    "replicated_with_grad_allreduce": _grad_allreduce,
}


def handler_registry() -> dict[str, Handler]:
    """Built-ins, then entry points (an entry point may not shadow a built-in)."""
    registry = dict(BUILTIN_HANDLERS)
    for ep in entry_point_group(ENTRY_POINT_GROUP):
        registry.setdefault(ep.name, ep.load())
    return registry


def check_handlers(plan: Plan) -> dict[str, Handler]:
    """Resolve every handler name up front (before anything is mutated)."""
    registry = handler_registry()
    found: dict[str, Handler] = {}
    for key, name in (plan.special_handlers or {}).items():
        if name not in registry:
            raise PlanError([error("runtime.unknown_handler", pointer("special_handlers", key),
                                   f"unknown special handler {name!r}",
                                   expected=", ".join(sorted(registry)),
                                   hint=f"register it under entry point group {ENTRY_POINT_GROUP}",
                                   )])
        found[key] = registry[name]
    return found


def apply_handlers(model: nn.Module, handlers: Mapping[str, Handler], active: Any) -> None:
    """Phase B: call each handler on its module and parameter name."""
    for key, handler in handlers.items():
        try:
            module, name = split_owner(model, key)
        except AttributeError:
            raise PlanError([error("runtime.missing_module", key,
                                   "special handler names a missing module")]) from None
        handler(module, name, active)
