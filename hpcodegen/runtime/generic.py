"""The generic boundary engine bound as ``module._hp_boundary``: a compiled redistribute plan.

Compiled once at install: per input name and per output index, the function that moves a
local tensor from its ``*_src`` to its ``*_dst`` placements. Transitions lowerable to one tp
collective run as such (:mod:`hpcodegen.runtime.collectives`); the others go through
``DTensor.from_local(src).redistribute(dst).to_local(grad_placements=...)``, where the
gradient placements are :func:`hpcodegen.plan.classify.grad_placements`, the rule the
lowered ops follow too: an input replicated on tp inside a compute-splitting boundary has a
``P(sum)`` gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpcodegen.binding import InputBinder, apply_outputs
from hpcodegen.errors import PlanError, error
from hpcodegen.plan.classify import BoundaryForm, Transition, grad_placements
from hpcodegen.plan.types import PlanEntry
from hpcodegen.runtime.collectives.local import map_local_tensors
from hpcodegen.runtime.collectives.transition import lowered_fn
from hpcodegen.runtime.mesh import TP, ActiveMesh, to_torch_placements


def dtensor_fn(t: Transition, active: ActiveMesh, split: bool, where: str) -> Callable[[Any], Any]:
    """``DTensor.redistribute`` of one transition on local tensors (nested tuples walked)."""
    from torch.distributed.tensor import DTensor

    bad = [s for s in t.steps if s.kind == "invalid"]
    if bad:
        raise PlanError([error("runtime.invalid_redistribute", where,
                               f"{t.side}put {t.name!r}: {bad[0].detail}")])
    grad, _ = grad_placements(t.side, t.src, t.dst, active.axes, split, t.enclosed)
    mesh = active.mesh

    def redistribute(value: torch.Tensor) -> torch.Tensor:
        nd = value.dim()
        d = DTensor.from_local(value, mesh, to_torch_placements(t.src, nd), run_check=False)
        d = d.redistribute(mesh, to_torch_placements(t.dst, nd))
        grad_placements = to_torch_placements(grad, nd) if t.side == "in" or t.enclosed \
            else None
        return d.to_local(grad_placements=grad_placements)
    return lambda value: map_local_tensors(value, redistribute)


def transition_fn(t: Transition, active: ActiveMesh, split: bool, where: str) -> Callable:
    """Lowered when ``t`` is one tp collective (or identity), else DTensor redistribute."""
    if t.op is not None:
        group = active.tp_group() if TP in active.axes else None
        return lowered_fn(t, group, where)
    return dtensor_fn(t, active, split, where)


def compile_transitions(form: BoundaryForm, entry: PlanEntry, active: ActiveMesh
                        ) -> tuple[dict[str, Callable], list[tuple[int, Callable]]]:
    """``({input name: fn}, [(output index, fn)])`` for a boundary's live transitions.

    Every input is compiled (identity ones unwrap); identity outputs are left out. Outputs
    are addressed by their position in ``out_names`` (:meth:`PlanEntry.output_index`).
    """
    split = entry.splits_compute()
    in_fns = {t.name: transition_fn(t, active, split, form.fqn) for t in form.inputs}
    out_fns = [(entry.output_index(t.name), transition_fn(t, active, split, form.fqn))
               for t in form.outputs if not t.is_identity]
    return in_fns, out_fns


class GenericBoundary:
    """``self._hp_boundary`` of one module: ``redistribute_inputs`` / ``redistribute_outputs``.

    Args:
        form: the live classification of the module's entry.
        entry: the typed plan entry (for its output order and ``splits_compute``).
        active: the live active mesh.
        forward: the compute forward whose signature input names bind to.
    """

    def __init__(self, form: BoundaryForm, entry: PlanEntry, active: ActiveMesh,
                 forward: Callable[..., Any]) -> None:
        self.fqn = form.fqn
        self.in_fns, self.out_fns = compile_transitions(form, entry, active)
        self.binder = InputBinder(forward, list(self.in_fns), form.fqn)

    def redistribute_inputs(self, payload: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        args, kwargs = payload
        return self.binder.apply(tuple(args), kwargs, self.in_fns)

    def redistribute_outputs(self, outputs: Any) -> Any:
        return apply_outputs(outputs, self.out_fns)

    def rewrap_outputs(self, outputs: Any) -> Any:
        """Outputs stay local tensors here; ``redistribute_outputs`` reads ``out_src``."""
        return outputs

    def __call__(self, impl: Callable[..., Any], deferred: Callable[[Any], Any] | None) -> Callable:
        """A forward running inputs -> ``impl`` -> outputs (-> deferred biases)."""

        def generic_boundary_forward(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = self.redistribute_inputs((args, kwargs))
            outputs = self.redistribute_outputs(impl(*args, **kwargs))
            return deferred(outputs) if deferred is not None else outputs
        return generic_boundary_forward

    def __repr__(self) -> str:
        return f"GenericBoundary({self.fqn})"
