"""Module hooks of a trace: a forward's arguments by name, its outputs by position, the
shapes of the tensors among them.

A plan names a boundary's inputs as its forward's parameters and its outputs by their
position in what the forward returns; every tracer user reads the traced tensors the same
way, through these helpers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: ``(shape, itemsize)``; itemsize is None for floating tensors (they take ``--dtype``)
TensorInfo = tuple[tuple[int, ...], int | None]


def tensor_info(value: Any) -> TensorInfo | None:
    """The shape (and, for a non-floating tensor, the itemsize) of a tensor; else None."""
    import torch

    if isinstance(value, torch.Tensor):
        return tuple(value.shape), None if value.is_floating_point() else value.element_size()
    return None


def outputs_of(output: Any) -> list[Any]:
    """A forward's outputs by position: a lone tensor is position 0, a ``ModelOutput`` its
    ``to_tuple()``, a tuple or list itself; anything else has no positions."""
    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    return list(output) if isinstance(output, (tuple, list)) else []


def argument_namer(module: Any, lone: str | None = None
                   ) -> Callable[[tuple[Any, ...], Mapping[str, Any]], dict[str, Any]]:
    """A function naming the arguments of one call of ``module.forward``: bound to its
    signature, ``**kwargs`` entries under their own names. A forward without a readable
    signature names its first positional argument ``lone`` (default ``"input"``)."""
    try:
        sig: inspect.Signature | None = inspect.signature(module.forward)
    except (TypeError, ValueError):
        sig = None

    def named(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = dict(kwargs)
        if sig is not None:
            try:
                bound = sig.bind_partial(*args, **kwargs).arguments
            except TypeError:
                bound = {}
            for key, value in bound.items():
                if sig.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
                    found.update(value)
                else:
                    found[key] = value
        elif args:
            found.setdefault(lone or "input", args[0])
        return found
    return named


@dataclass
class Recording:
    """Tensors seen at the watched modules, the first call's: ``(fqn, "in", name)`` and
    ``(fqn, "out", position)`` -> :data:`TensorInfo`; and the calls per FQN."""

    tensors: dict[tuple[str, str, Any], TensorInfo] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)


def record_tensors(modules: Mapping[str, Any], recording: Recording,
                   lone: Mapping[str, str] | None = None) -> list[Any]:
    """Hook each ``{fqn: module}`` to record its tensor arguments by name and its tensor
    outputs by position into ``recording``; returns the hook handles (see :func:`removed`).
    ``lone[fqn]`` names the first argument of a forward without a readable signature."""
    handles: list[Any] = []
    for fqn, module in modules.items():
        named = argument_namer(module, (lone or {}).get(fqn))

        def pre(_m: Any, args: tuple, kwargs: dict, f: str = fqn,
                name_of: Callable[..., dict[str, Any]] = named) -> None:
            recording.calls[f] = recording.calls.get(f, 0) + 1
            for name, value in name_of(args, kwargs).items():
                info = tensor_info(value)
                if info is not None:
                    recording.tensors.setdefault((f, "in", name), info)

        def post(_m: Any, _args: Any, output: Any, f: str = fqn) -> None:
            for index, value in enumerate(outputs_of(output)):
                info = tensor_info(value)
                if info is not None:
                    recording.tensors.setdefault((f, "out", index), info)

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post))
    return handles


@contextmanager
def removed(handles: list[Any]) -> Iterator[list[Any]]:
    """Yield ``handles`` (hooks may still be added to it) and remove them all on exit."""
    try:
        yield handles
    finally:
        for handle in handles:
            handle.remove()
