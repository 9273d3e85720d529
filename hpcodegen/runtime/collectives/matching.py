"""The ``self._hp_tp`` of a generated boundary: name-free calls matched to its transitions.

The generated forward calls ``self._hp_tp.all_gather(x, dim=1)``; :class:`TPOps` finds the
planned transition that call runs (docs/design.md, "Generated code contract").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.classify import TPOp, Transition
from hpcodegen.runtime.collectives.autograd import apply_lowered
from hpcodegen.runtime.collectives.traced import traced_lowered
from hpcodegen.runtime.collectives.transition import lowered_fn


class TPOps:
    """The ``self._hp_tp`` of one boundary instance: name-free calls, per-transition autograd.

    The generated forward calls ``self._hp_tp.all_gather(x, dim=1)`` without naming ``x``.
    Binding: each call is matched to the boundary's transitions by ``(kind, dim)``; when
    several transitions match (and they may differ in backward, e.g. an input and an output
    all_reduce), the one after the previous call wins, in the generated call order (inputs
    by sorted name, then outputs), wrapping around at the next forward. A call that matches
    no transition is a PlanError: the file and the meta disagree.

    The match depends only on ``(kind, dim, tensor rank, previous call)``, so it is resolved
    once per such key and remembered. When no kind is declared twice (the common case: one
    input ``to_local``, one output ``all_reduce``) the previous call cannot change any match,
    and each declared kind's method is bound on the instance straight to its transition's
    function (a dim that does not match still takes the checked path and its PlanError).
    """

    def __init__(self, fqn: str, transitions: Sequence[Transition], group: Any) -> None:
        self.fqn = fqn
        self._calls: list[tuple[TPOp, Callable[[Any], Any]]] = [
            (t.op, lowered_fn(t, group, fqn))
            for t in transitions
            if t.op is not None and not (t.side == "out" and t.is_identity)
        ]
        self._cursor = 0
        self._bound: dict[tuple[str, int | None, int | None, int], int] = {}
        kinds = [op.kind for op, _ in self._calls]
        if len(set(kinds)) == len(kinds):
            for op, fn in self._calls:
                setattr(self, _METHOD[op.kind], self._direct(op, fn))

    def _direct(self, op: TPOp, fn: Callable[[Any], Any]) -> Callable[..., Any]:
        """The method for ``op.kind`` when only ``op`` can match it: no cursor, no lookup."""
        if op.kind in ("identity", "all_reduce"):
            return fn  # ``run(tensor)``: the method's own signature
        kind, declared = op.kind, op.dim

        def direct(tensor: Any, dim: int | None = None) -> Any:
            if dim is None or declared is None or dim == declared:
                return fn(tensor)
            return self._call(kind, dim, tensor)  # equal modulo the rank, or a PlanError
        return direct

    def to_local(self, tensor: Any) -> Any:
        return self._call("identity", None, tensor)

    def all_gather(self, tensor: Any, dim: int | None = None) -> Any:
        return self._call("all_gather", dim, tensor)

    def all_reduce(self, tensor: Any) -> Any:
        return self._call("all_reduce", None, tensor)

    def reduce_scatter(self, tensor: Any, dim: int | None = None) -> Any:
        return self._call("reduce_scatter", dim, tensor)

    def _call(self, kind: str, dim: int | None, tensor: Any) -> Any:
        ndim = tensor.dim() if isinstance(tensor, torch.Tensor) else None
        key = (kind, dim, ndim, self._cursor)
        index = self._bound.get(key)
        if index is None:
            index = self._bound[key] = self._match(kind, dim, ndim)
        self._cursor = index + 1
        return self._calls[index][1](tensor)

    def _match(self, kind: str, dim: int | None, ndim: int | None) -> int:
        hits = [i for i, (op, _) in enumerate(self._calls)
                if op.kind == kind and _same_dim(op.dim, dim, ndim)]
        if not hits:
            if kind == "identity":
                return self._identity_index()
            raise PlanError([error(
                "runtime.unbound_call", self.fqn,
                f"the generated forward calls {kind}(dim={dim}) but the plan declares no such "
                "transition", expected=", ".join(str(op) for op, _ in self._calls) or "none",
                hint="regenerate the artifact: the modeling file and the meta disagree")])
        after = [i for i in hits if i >= self._cursor]
        return after[0] if after else hits[0]

    def _identity_index(self) -> int:
        """An undeclared ``to_local`` only unwraps: a plain identity with no backward."""
        self._calls.append((TPOp("identity"), apply_lowered(None, None)))
        return len(self._calls) - 1

    def bind_traced(self) -> bool:
        """Bind each declared kind's method to its transition's compiled-model form.

        Called on the boundaries a ``torch.compile`` scope covers
        (:func:`hpcodegen.runtime.compile.compile_parallelized`): the same collectives and
        autograd as the eager methods under ``torch.compiler.is_compiling()``, with a
        fraction of the objects dynamo guards on every call; run eagerly (a graph break,
        ``force_eager``) they stay exact, through the functional collectives. Only when no
        kind is declared twice (otherwise the call order picks the transition and the
        eager methods stay); False then.
        """
        kinds = [op.kind for op, _ in self._calls]
        if len(set(kinds)) != len(kinds):
            return False
        if "identity" not in kinds:  # an undeclared ``to_local`` only unwraps
            self.to_local = traced_lowered(None, None)  # type: ignore[method-assign]
        for op, fn in self._calls:
            traced = getattr(fn, "traced", None)  # an undeclared identity has none
            mismatch = functools.partial(self._mismatch, op.kind)
            setattr(self, _METHOD[op.kind], traced(mismatch=mismatch) if traced is not None
                    else traced_lowered(None, None))
        return True

    def _mismatch(self, kind: str, value: Any, dim: int) -> Any:
        return self._call(kind, dim, value)  # equal modulo the rank, or a PlanError

    def __repr__(self) -> str:
        return f"TPOps({self.fqn}: {', '.join(str(op) for op, _ in self._calls)})"


_METHOD = {"identity": "to_local", "all_gather": "all_gather", "all_reduce": "all_reduce",
           "reduce_scatter": "reduce_scatter"}


def _same_dim(declared: int | None, called: int | None, ndim: int | None) -> bool:
    """Equal dims, also when one counts from the end (``-1`` vs ``2`` on a 3-D tensor)."""
    if declared is None or called is None or declared == called:
        return True
    return ndim is not None and declared % ndim == called % ndim
