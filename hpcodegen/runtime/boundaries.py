"""Phase C: install every boundary, deepest FQN first.

Per module (the effective form comes from :func:`hpcodegen.plan.revalidate.decide`, the same
decision ``inspect-plan --mesh`` shows):

* a generated class (it has ``_forward_impl``) marked ``tp_collective`` gets a per-instance
  :class:`~hpcodegen.runtime.collectives.matching.TPOps` as ``_hp_tp``; when the live mesh
  contradicts the frozen form, the generic engine replaces ``forward`` and a warning names
  the module;
* another generated class gets the generic engine as ``_hp_boundary``;
* a class not defined in the generated file (``nn.Linear``, ``nn.Embedding``, or an
  unmodified transformers class) has its *instance* forward wrapped: inputs -> original ->
  outputs (-> deferred biases).

Before any boundary, every row-sharded token embedding, generated class or not, gets the
masked vocab-parallel lookup around its compute (:mod:`hpcodegen.runtime.embedding`).

Deferred biases (``deferred_bias_params``) are hidden from the rowwise layer and added once
after the output reduction, by ``module._hp_deferred_bias``. Parameters only tp rank 0
applies (``tp_rank0_params``: a per-expert bias inside a tp-split experts compute) are
seen times 0 on the other tp ranks (:func:`tp_rank0_only`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from hpcodegen.binding import InputBinder, apply_outputs, compile_outputs
from hpcodegen.errors import PlanError, error
from hpcodegen.plan.classify import BoundaryForm
from hpcodegen.plan.entry import (
    FORM_MARKERS,
    TOGGLE_FORM_MARKER,
    TP_FORM_MARKER,
    fqn_depth,
    takes_token_ids,
)
from hpcodegen.plan.revalidate import decide
from hpcodegen.plan.types import Plan, PlanEntry
from hpcodegen.runtime.collectives.matching import TPOps
from hpcodegen.runtime.embedding import install_vocab_lookups
from hpcodegen.runtime.generic import GenericBoundary, compile_transitions
from hpcodegen.runtime.local_views import local_view
from hpcodegen.runtime.mesh import ActiveMesh
from hpcodegen.runtime.params import ShardedParam, param_owner
from hpcodegen.sp_positions import install_default_position_ids


class RuntimeFallbackWarning(UserWarning):
    """A frozen tp_collective boundary runs on the generic engine on this live mesh."""


def _marker(module: nn.Module) -> str | None:
    for attr in FORM_MARKERS:
        value = getattr(type(module), attr, None)
        if isinstance(value, str):
            return value
    return None


def _bind(module: nn.Module, name: str, value: Any) -> None:
    """Bind both naming generations (``_hp_*`` and ``_hyper_*``) on the instance."""
    module.__dict__[f"_hp_{name}"] = value
    module.__dict__[f"_hyper_{name}"] = value


def _bias_free(owner: nn.Module, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` run with ``owner.<name>`` hidden, restored afterwards (``fn``'s signature
    kept: inputs bind to it by name).

    An ``nn.Linear`` (or subclass) skips a None bias; another module may add its bias
    unconditionally (transformers' ``Conv1D`` calls ``addmm(self.bias, ...)``), so it sees
    zeros instead: the same output, and no gradient reaches the hidden bias there.
    """
    skips_none = isinstance(owner, nn.Linear)

    @functools.wraps(fn)
    def bias_free_forward(*args: Any, **kwargs: Any) -> Any:
        saved = owner._parameters[name]
        owner._parameters[name] = None if skips_none or saved is None \
            else torch.zeros_like(saved, requires_grad=False)
        try:
            return fn(*args, **kwargs)
        finally:
            owner._parameters[name] = saved
    return bias_free_forward


def install_deferred_bias(module: nn.Module, fqn: str, entry: PlanEntry
                          ) -> Callable[[Any], Any] | None:
    """Hide each deferred bias inside and return the exit hook that adds it once.

    The bias is hidden from the forward that would add it: a child's own ``forward``; for
    the boundary's own bias, its compute (a generated class's ``_forward_impl``) or, on a
    wrapped class, its instance ``forward``, which the boundary wrapper then calls. A
    bias added to a tp shard has a partial gradient: the api's gradient sync covers it
    (:meth:`~hpcodegen.plan.types.PlanEntry.effective_partial_grad_params`).
    """
    paths = list(entry.deferred_bias_params or ())
    if not paths:
        return None
    for path in paths:
        owner, name = param_owner(module, path, "deferred_bias_params", prefix=fqn)
        attr = "_forward_impl" if owner is module and hasattr(module, "_forward_impl") \
            else "forward"
        setattr(owner, attr, _bias_free(owner, getattr(owner, attr), name))

    def add_deferred_biases(outputs: Any) -> Any:
        biases = [module.get_parameter(p) for p in paths]
        return apply_outputs(outputs, [(0, lambda x: _add_all(x, biases))])
    _bind(module, "deferred_bias", add_deferred_biases)
    return add_deferred_biases


def tp_rank0_only(module: nn.Module, fqn: str, entry: PlanEntry,
                  active: ActiveMesh, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with each ``tp_rank0_params`` parameter seen as ``p * m``, ``m`` 1 on tp
    rank 0 and 0 elsewhere: a bias added inside a tp-split compute to every rank's partial
    output (GPT-OSS's per-expert ``down_proj_bias``) is then counted once by the reduction.
    Every rank keeps the parameter in its graph (``1 * p`` is exact), so the gradient
    hooks fire alike and the all-reduce of this partial gradient (rank 0's) matches."""
    paths = entry.tp_rank0_params or ()
    if not paths or active.tp_size <= 1:
        return fn
    import torch.distributed as dist

    scale = 1.0 if dist.get_rank(active.tp_group()) == 0 else 0.0
    owners = [param_owner(module, path, "tp_rank0_params", prefix=fqn) for path in paths]

    @functools.wraps(fn)
    def rank0_forward(*args: Any, **kwargs: Any) -> Any:
        saved = [owner._parameters[name] for owner, name in owners]
        for (owner, name), param in zip(owners, saved, strict=True):
            owner._parameters[name] = param * scale
        try:
            return fn(*args, **kwargs)
        finally:
            for (owner, name), param in zip(owners, saved, strict=True):
                owner._parameters[name] = param
    return rank0_forward


def _add_all(x: Any, biases: list[Any]) -> Any:
    for b in biases:  # a child's DTensor bias, read after its forward: its local view
        x = x + local_view(b)
    return x


def _install_generated(module: nn.Module, fqn: str, entry: PlanEntry,
                       live: BoundaryForm, effective: str, active: ActiveMesh) -> str:
    marker = _marker(module)
    deferred = install_deferred_bias(module, fqn, entry)
    if entry.tp_rank0_params:
        module._forward_impl = tp_rank0_only(module, fqn, entry, active, module._forward_impl)
    if marker in (TP_FORM_MARKER, TOGGLE_FORM_MARKER) and effective == "tp_collective":
        _bind(module, "tp", TPOps(fqn, live.transitions, active.tp_group()))
        if marker == TOGGLE_FORM_MARKER:
            for axis in ("tp", "cp", "ep"):
                setattr(module, f"{axis}_enable", axis in active.axes)
        return "tp_collective"
    engine = GenericBoundary(live, entry, active, module._forward_impl)
    if marker in (TP_FORM_MARKER, TOGGLE_FORM_MARKER):
        warnings.warn(f"{fqn} ({type(module).__name__}): the frozen tp_collective form does "
                      f"not hold on the live mesh {active.axes} (live form {live.form}); "
                      "running it on the generic redistribute engine",
                      RuntimeFallbackWarning, stacklevel=4)
        module.forward = engine(module._forward_impl, deferred)
        return "generic"
    _bind(module, "boundary", engine)
    return "generic"


def _install_wrapped(module: nn.Module, fqn: str, entry: PlanEntry,
                     live: BoundaryForm, effective: str, active: ActiveMesh,
                     sharded: Mapping[str, ShardedParam]) -> str:
    deferred = install_deferred_bias(module, fqn, entry)
    if effective == "identity" and deferred is None:
        return "identity"
    original = module.forward
    call = original
    if effective == "region":  # inputs -> the injected local compute -> outputs

        def call(*args: Any, **kwargs: Any) -> Any:
            return module.__dict__["__hp_compute__"](*args, **kwargs)
    call = tp_rank0_only(module, fqn, entry, active, call)
    in_fns, out_fns = compile_transitions(live, entry, active)
    module.forward = _boundary_forward(original, call, in_fns, out_fns, deferred, fqn)
    # what compile_parallelized binds before compiling (the group exists by then)
    module.__dict__["_hp_traced_forward"] = functools.partial(
        _traced_boundary_forward, original, call, in_fns, out_fns, deferred, fqn)
    return effective


def _boundary_forward(original: Callable[..., Any], call: Callable[..., Any],
                      in_fns: Mapping[str, Callable[[Any], Any]],
                      out_fns: list[tuple[int, Callable[[Any], Any]]],
                      deferred: Callable[[Any], Any] | None, fqn: str) -> Callable[..., Any]:
    """A wrapped module's forward: inputs -> ``call`` -> outputs (-> deferred biases)."""
    bind_in = InputBinder(original, list(in_fns), fqn).compile(in_fns)
    bind_out = compile_outputs(out_fns)

    def hp_boundary_forward(*args: Any, **kwargs: Any) -> Any:
        if bind_in is not None:
            args, kwargs = bind_in(args, kwargs)
        outputs = call(*args, **kwargs)
        if bind_out is not None:
            outputs = bind_out(outputs)
        return deferred(outputs) if deferred is not None else outputs
    return hp_boundary_forward


def _traced_boundary_forward(original: Callable[..., Any], call: Callable[..., Any],
                             in_fns: Mapping[str, Callable[[Any], Any]],
                             out_fns: list[tuple[int, Callable[[Any], Any]]],
                             deferred: Callable[[Any], Any] | None, fqn: str
                             ) -> Callable[..., Any]:
    """:func:`_boundary_forward` over the transitions' compiled-model forms (the lowered
    ones' ``traced``: the same collectives, far fewer objects for dynamo to guard)."""
    def traced(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        form = getattr(fn, "traced", None)
        return form() if form is not None else fn
    return _boundary_forward(original, call, {name: traced(fn) for name, fn in in_fns.items()},
                             [(index, traced(fn)) for index, fn in out_fns], deferred, fqn)


def install_boundaries(model: nn.Module, plan: Plan, active: ActiveMesh,
                       frozen: Mapping[str, BoundaryForm], live: Mapping[str, BoundaryForm],
                       sharded: Mapping[str, ShardedParam]) -> dict[str, str]:
    """Phase C over the plan; returns ``{fqn: installed form}``."""
    entries = plan.entries
    installed: dict[str, str] = {}
    install_vocab_lookups(model, sharded, active)
    for fqn in sorted(entries, key=fqn_depth, reverse=True):
        if live[fqn].form == "params" or (active.degenerate and live[fqn].form != "region"):
            continue  # no dense axis (an ep-only install): only the expert regions run
        try:
            module = model.get_submodule(fqn) if fqn else model
        except AttributeError:
            raise PlanError([error("runtime.missing_module", fqn,
                                   "the plan names a module the model does not have")]) from None
        if getattr(module, "_hp_installed", False):
            raise PlanError([error("runtime.reinstall", fqn, "boundary already installed")])
        entry = entries[fqn]
        effective, _ = decide(frozen[fqn], live[fqn], active.axes)
        if takes_token_ids(type(module).__name__) and entry.output_sequence_sharded() \
                and "." in fqn:
            install_default_position_ids(model.get_submodule(fqn.rpartition(".")[0]))
        if hasattr(module, "_forward_impl"):
            if effective != "identity":
                installed[fqn] = _install_generated(module, fqn, entry, live[fqn],
                                                    effective, active)
        else:
            installed[fqn] = _install_wrapped(module, fqn, entry, live[fqn], effective,
                                              active, sharded)
        module._hp_installed = True
    return installed
