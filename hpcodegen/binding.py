"""Apply per-name input functions and per-index output functions to a forward's call.

Wrapped instances (``nn.Linear``, ``nn.Embedding``, unmodified transformers classes) and the
generic engine see ``(args, kwargs)``, not names. Input names bind to the forward's
signature: a keyword wins, else the positional index; a lone input whose name is not in the
signature binds to position 0 (``nn.Linear.forward(input)`` declared as ``hidden_states``).
Outputs bind by their index in ``out_names`` (unknown names are index 0).

One binding for whoever runs a plan's transitions on a forward: the runtime's boundaries
and generic engine, and ``generate --sp``'s shape run (:mod:`hpcodegen.generate.checks.sp_check`),
which must bind exactly as the runtime will. Imports no torch (``compile_outputs`` does,
when called).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpcodegen.errors import PlanError, error

ValueFn = Callable[[Any], Any]


class InputBinder:
    """Maps input names of a boundary to argument positions of one forward signature."""

    def __init__(self, forward: Callable[..., Any], names: Sequence[str], where: str) -> None:
        try:
            params = list(inspect.signature(forward).parameters.values())
        except (TypeError, ValueError):
            params = []
        positional = [p.name for p in params
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        known = {p.name for p in params}
        self.index: dict[str, int | None] = {}
        unknown = [n for n in names if n not in known]
        if unknown and len(names) == 1:
            self.index[names[0]] = 0
            return
        has_var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
        if unknown and not has_var_kw:
            raise PlanError([error("runtime.unknown_input", where,
                                   f"inputs {unknown} are not parameters of the forward",
                                   expected=", ".join(sorted(known)) or "no parameters")])
        for name in names:
            self.index[name] = positional.index(name) if name in positional else None

    def apply(self, args: tuple[Any, ...], kwargs: Mapping[str, Any],
              fns: Mapping[str, ValueFn]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Run ``fns[name]`` on each bound argument that is present and not None."""
        new_args, new_kwargs = list(args), dict(kwargs)
        for name, fn in fns.items():
            if name in new_kwargs:
                if new_kwargs[name] is not None:
                    new_kwargs[name] = fn(new_kwargs[name])
                continue
            i = self.index.get(name)
            if i is not None and i < len(new_args) and new_args[i] is not None:
                new_args[i] = fn(new_args[i])
        return tuple(new_args), new_kwargs

    def compile(self, fns: Mapping[str, ValueFn]
                ) -> Callable[[tuple[Any, ...], dict[str, Any]],
                              tuple[tuple[Any, ...], dict[str, Any]]] | None:
        """``apply`` with ``fns`` fixed, specialised for the common lone input.

        Why: a wrapped ``nn.Embedding`` / ``lm_head`` runs this on every call, and the general
        form copies the arguments into a list and a dict each time. None when there is
        nothing to apply.
        """
        if not fns:
            return None
        if len(fns) > 1:
            return lambda args, kwargs: self.apply(args, kwargs, fns)
        ((name, fn),) = fns.items()
        i = self.index.get(name)

        def bind_one(args: tuple[Any, ...], kwargs: dict[str, Any]
                     ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            if name in kwargs:
                value = kwargs[name]
                return args, (kwargs if value is None else {**kwargs, name: fn(value)})
            if i is not None and i < len(args) and args[i] is not None:
                args = (*args[:i], fn(args[i]), *args[i + 1:])
            return args, kwargs
        return bind_one


def apply_outputs(outputs: Any, fns: Sequence[tuple[int, ValueFn]]) -> Any:
    """Run each ``(index, fn)`` on the forward's outputs, keeping the container type.

    A single (non-tuple) output takes the index-0 function; an index beyond a tuple is a
    PlanError.
    """
    if not fns:
        return outputs
    if isinstance(outputs, (tuple, list)):
        items = list(outputs)
        for index, fn in fns:
            if index >= len(items):
                raise PlanError([error("runtime.output_index", "",
                                       f"output index {index} beyond {len(items)} outputs")])
            if items[index] is not None:
                items[index] = fn(items[index])
        return type(outputs)(items) if type(outputs) in (tuple, list) else outputs.__class__(*items)
    if hasattr(outputs, "to_tuple") and hasattr(outputs, "keys"):
        keys = list(outputs.keys())
        for index, fn in fns:
            outputs[keys[index]] = fn(outputs[keys[index]])
        return outputs
    for index, fn in fns:
        if index == 0 and outputs is not None:
            outputs = fn(outputs)
    return outputs


def compile_outputs(fns: Sequence[tuple[int, ValueFn]]) -> ValueFn | None:
    """``apply_outputs`` with ``fns`` fixed; a lone index-0 function on a plain tensor output
    (``nn.Embedding``, ``nn.Linear``) is called directly. None when there is nothing to apply.
    """
    if not fns:
        return None
    fns = list(fns)
    if len(fns) == 1 and fns[0][0] == 0:
        import torch

        plain, fn = torch.Tensor, fns[0][1]
        return lambda outputs: (fn(outputs) if type(outputs) is plain
                                else apply_outputs(outputs, fns))
    return lambda outputs: apply_outputs(outputs, fns)
