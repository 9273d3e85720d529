"""Follow the tensors derived from a seed through every aten op of one forward.

A ``TorchDispatchMode`` sees each aten operation the forward runs, after autograd and
Python-level sugar are gone (``x[..., :n]`` arrives as ``aten.slice``, ``x.float()`` as
``aten._to_copy``, ``softmax`` as ``aten._softmax``), with its ``OpOverload`` and the
tags torch declares for it (:func:`is_pointwise`). :class:`DerivedTensors` keeps the
tensors derived from what :meth:`~DerivedTensors.mark` seeded (a module's output, marked
from a forward hook) and asks a *judge* about every op that reads one of them: follow its
outputs, drop them (the op only read metadata), or refuse the op (the first refusal is
kept, with the model source line that made it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: a judge's verdicts besides a refusal (a str): the op's outputs are derived too, or not
FOLLOW = "follow"
DROP = "drop"

#: ``judge(op, args, kwargs, derived) -> FOLLOW | DROP | refusal text``; ``derived(t)``
#: tells whether tensor ``t`` derives from the seed
Judge = Callable[[Any, tuple, Mapping[str, Any], Callable[[Any], bool]], str]

_HERE = str(Path(__file__).resolve().parent)


def tensors(value: Any) -> list[Any]:
    """The tensors in a nest of tuples, lists and dicts, in torch's pytree order.

    Asked of every aten op's operands and results by each watcher of a trace: plain
    tuples, lists, dicts and scalars are walked here, and only what torch's pytree
    knows more about (a named tuple, a ``ModelOutput``) goes through ``tree_flatten``,
    which reads the same leaves at several times the cost."""
    import torch

    found: list[Any] = []
    _collect(value, found, torch.Tensor, _scalars())
    return found


@functools.cache
def _scalars() -> tuple[type, ...]:
    """Leaves that are never a tensor nor hold one: the aten arguments besides tensors."""
    import torch

    return (type(None), bool, int, float, complex, str, torch.dtype, torch.device,
            torch.layout, torch.memory_format)


def _collect(value: Any, found: list[Any], tensor: type, scalars: tuple[type, ...]) -> None:
    """Append the tensors in ``value`` to ``found`` (:func:`tensors`)."""
    kind = type(value)
    if kind is tuple or kind is list:
        for item in value:
            _collect(item, found, tensor, scalars)
    elif kind is dict:
        for item in value.values():
            _collect(item, found, tensor, scalars)
    elif isinstance(value, tensor):
        found.append(value)
    elif not isinstance(value, scalars):
        from torch.utils._pytree import tree_flatten

        found.extend(x for x in tree_flatten(value)[0] if isinstance(x, tensor))


def is_pointwise(op: Any) -> bool:
    """Whether torch tags the aten ``OpOverload`` ``torch.Tag.pointwise``: each output entry
    depends only on the input entries at the same (broadcast) position."""
    import torch

    return torch.Tag.pointwise in getattr(op, "tags", ())


def op_name(op: Any) -> str:
    """``aten.<name>`` of an ``OpOverload`` (its overload packet: ``aten._softmax``)."""
    packet = getattr(op, "overloadpacket", None)
    return f"aten.{getattr(packet, '__name__', None) or getattr(op, '__name__', repr(op))}"


def source_line() -> str:
    """``file:line`` of the model code that made the current torch call (frames of torch
    and of this package skipped; transformers' files from ``transformers/`` on)."""
    import sys

    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(_HERE)
                                 or "/torch/" in frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    marker = "/transformers/"
    short = path[path.index(marker) + 1:] if marker in path else path
    return f"{short}:{frame.f_lineno}"


#: ``observe(op, args, kwargs, out)``: one aten op that ran, and what it returned
Observer = Callable[[Any, tuple, Mapping[str, Any], Any], None]


def watch_ops(observe: Observer,
              failed: Callable[[Any, tuple, Mapping[str, Any]], None] | None = None) -> Any:
    """THE tracer's dispatch mode: a ``TorchDispatchMode`` that runs every aten op of the
    forward it wraps unchanged and hands it, with its result, to ``observe``; an op that
    raises goes to ``failed`` first and its error propagates. Every op-level watcher of
    hpcodegen (the derived-tensor judge below, generate's cp probe) is one ``observe``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            try:
                out = func(*args, **kwargs)
            except Exception:
                if failed is not None:
                    failed(func, args, kwargs)
                raise
            observe(func, args, kwargs, out)
            return out

    return Watch()


class DerivedTensors:
    """The tensors derived from the marked ones through one forward, and the first op on
    them its judge refused (``violation``: the judge's text and the source line)."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.derived: dict[int, Any] = {}  # id -> tensor: held, so no id is reused
        self.violation: str | None = None

    def reset(self) -> None:
        self.derived.clear()
        self.violation = None

    def mark(self, value: Any) -> None:
        for t in tensors(value):
            self.derived[id(t)] = t

    def is_derived(self, value: Any) -> bool:
        return any(id(t) in self.derived for t in tensors(value))

    def refuse(self, text: str) -> None:
        self.violation = f"{text} (at {source_line()})"

    def mode(self) -> Any:
        """A dispatch mode (:func:`watch_ops`) applying the judge to every op of the forward
        it wraps. An op that raises on a derived tensor (``.item()`` on meta) is refused as
        reading values, and the error propagates."""
        return watch_ops(self.observe, self._failed)

    def _failed(self, op: Any, args: tuple, kwargs: Mapping[str, Any]) -> None:
        if self.violation is None and self.is_derived((args, dict(kwargs))):
            self.refuse(f"{op_name(op)} reads values")

    def observe(self, op: Any, args: tuple, kwargs: Mapping[str, Any], out: Any) -> None:
        """Judge one op that ran; mark its outputs when the judge follows them."""
        if self.violation is not None or not self.is_derived((args, dict(kwargs))):
            return  # not on the followed path (or already refused)
        if not tensors(out):
            return  # no tensor out: metadata (a value read fails on meta: see mode())
        verdict = self.judge(op, args, kwargs, lambda t: id(t) in self.derived)
        if verdict == FOLLOW:
            self.mark(out)
        elif verdict != DROP:
            self.refuse(verdict)
