"""Install context parallelism on a model: its own config, the root forward's batch view.

:func:`install_context_parallel` runs once per model, after the boundaries and before the
injection factories (the ``inner_wrapper`` of each attention, :mod:`.wrappers`, then binds
the module's CP kernel):

1. the model gets its own deep copy of its config (every module that held the old one, or
   one of its sub-configs, now holds the copy), whose ``_attn_implementation`` is this
   model's registered CP name (:func:`.attention.register`): transformers then builds the
   masks with the CP mask function and every attention module calls the CP attention. The
   caller's config object is left as it was (an unsharded reference built from it runs
   plain);
2. the root model's forward is wrapped (an instance attribute, as the sequence-parallel
   position-id wrapper: a pre-hook returning new arguments would cost ``torch.compile`` a
   graph break); the wrapper reads this forward's inputs (``input_ids`` or
   ``inputs_embeds``, ``attention_mask``, ``position_ids``; every rank passes its own chunk
   of the sequence, see :mod:`.batch`), and records the batch view the masks need:

   * no ``position_ids``: they default to the tokens' global positions (the layout's);
   * a 2-D ``attention_mask`` (padding): all-gathered over cp, in original order (``valid``);
     the model keeps its local mask for whatever else it does with it per token;
   * ``position_ids`` without a mask: all-gathered, and documents found where they do not
     step by one (transformers' packed-sequence rule, on the whole sequence), applied
     where the model asks transformers for packed detection (:func:`watch_packed_detection`);

   and turns the cache off. ``labels=`` is refused: transformers would shift them inside
   this rank's chunk (pre-shift them and use :func:`.batch.CPBatch.loss`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from hpcodegen.errors import PlanError, error
from hpcodegen.runtime.collectives.comm import Comm
from hpcodegen.runtime.collectives.ops import gather
from hpcodegen.runtime.cp.attention import kv_gather, register
from hpcodegen.runtime.cp.state import BatchView, CPState

STATE_ATTR = "_hp_cp_state"


def cp_state(model: nn.Module) -> CPState | None:
    """The model's :class:`CPState`, None when it runs without context parallelism."""
    return model.__dict__.get(STATE_ATTR)


def _own_config(model: nn.Module) -> Any:
    """Give ``model`` a deep copy of its config, sub-configs included; return it."""
    old = getattr(model, "config", None)
    if old is None or not hasattr(old, "_attn_implementation"):
        raise PlanError([error("runtime.cp_no_config", type(model).__name__,
                               "context parallelism needs a transformers model (one with a "
                               "config)")])
    new = copy.deepcopy(old)
    pairs: dict[int, Any] = {}
    _pair_configs(old, new, pairs)
    for module in model.modules():
        held = module.__dict__.get("config")
        if held is not None and id(held) in pairs:
            module.config = pairs[id(held)]
    return new


def _pair_configs(old: Any, new: Any, pairs: dict[int, Any]) -> None:
    """``{id(config): its deep copy}`` for ``old`` and every config nested in it (sub-configs,
    per-layer config lists), walked in parallel with the copy (attributes read from
    ``vars``: a heterogeneous config refuses some attribute reads)."""
    if hasattr(old, "_attn_implementation") and id(old) not in pairs:
        pairs[id(old)] = new
        for key, value in vars(old).items():
            _pair_configs(value, vars(new).get(key), pairs)
    elif isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        for a, b in zip(old, new, strict=False):
            _pair_configs(a, b, pairs)
    elif isinstance(old, dict) and isinstance(new, dict):
        for key, value in old.items():
            _pair_configs(value, new.get(key), pairs)


def _positional_names(model: nn.Module) -> list[str]:
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _gather_rows(x: torch.Tensor, state: CPState, order: torch.Tensor) -> torch.Tensor:
    """``[B, S_local]`` -> ``[B, S]`` over cp, in original order."""
    return gather(x.contiguous(), 1, state.comm)[:, order]


def batch_view(state: CPState, tokens: torch.Tensor, mask: Any, positions: Any,
               seq_shards: int = 1) -> BatchView:
    """The global view of one forward's batch (see the module docstring); ``seq_shards``:
    the rank's positions are ``seq_shards`` times the tokens given (hidden states received
    sequence-sharded over tp as well, by a pipeline stage under sequence parallelism)."""
    local = tokens.shape[1] * seq_shards
    seq = local * state.size
    q_index, kv_index = state.indices(seq, tokens.device)
    view = BatchView(q_index, kv_index, state.query_rows(seq, tokens.device))
    order = state.restore_order(seq, tokens.device)
    if mask is not None:
        view.valid = _gather_rows(mask.to(torch.uint8), state, order).to(torch.bool)
    elif positions is not None and positions.dim() == 2:  # [B or 1, S_local]
        full = _gather_rows(positions.expand(tokens.shape[0], -1), state, order)
        first = full[:, :1] - 1
        view.documents = (torch.diff(full, prepend=first, dim=-1) != 1).cumsum(-1)
        view.positions = full
    elif positions is not None:
        view.unreadable_positions = True
    return view


#: the cp states of the forwards running now (innermost last)
ACTIVE: list[CPState] = []


def _cp_forward(original: Any, state: CPState, names: list[str], accepts: set[str]) -> Any:
    def hp_cp_forward(*args: Any, **kwargs: Any) -> Any:
        kwargs = _cp_inputs(state, names, accepts, args, kwargs)
        ACTIVE.append(state)
        try:
            return original(**kwargs)
        finally:
            ACTIVE.pop()
    return hp_cp_forward


def cp_call(state: CPState, fn: Any, kwargs: dict[str, Any], seq_shards: int = 1) -> Any:
    """``fn(**kwargs)`` as the cp root wrapper runs the model: the batch view recorded from
    this call's tokens (``input_ids`` or ``inputs_embeds``: a pipeline stage after the first
    feeds hidden states), default position ids at the layout's positions, the state
    active. A pipeline stage (a cut of the root model) calls this instead of the root's
    wrapper, which would run the whole model. ``seq_shards``: the tokens given are
    ``1/seq_shards`` of this cp rank's positions (hidden states received sharded over tp
    too, under sequence parallelism): the view and the position ids cover all of them."""
    kwargs = _cp_inputs(state, [], {"use_cache"}, (), kwargs, seq_shards)
    ACTIVE.append(state)
    try:
        return fn(**kwargs)
    finally:
        ACTIVE.pop()


def watch_packed_detection() -> None:
    """Have transformers' packed-sequence detection tell the cp state when the model asks
    for it, instead of running on this rank's position ids (once per process).

    transformers looks for packed documents only when the model hands ``position_ids`` to
    its mask creation and no 2-D mask was given (``find_packed_sequence_indices``, called by
    every ``create_*_mask``); under cp the local ids are in layout order and would look
    packed. Inside a cp forward the call records the request (the mask function then
    applies the documents found on the whole sequence) and answers "not packed"; anywhere
    else it is transformers' own function.
    """
    import transformers.masking_utils as masking

    if getattr(masking.find_packed_sequence_indices, "_hp_cp", False):
        return
    original = masking.find_packed_sequence_indices

    def find_packed_sequence_indices(position_ids: torch.Tensor) -> Any:
        if not ACTIVE:
            return original(position_ids)
        ACTIVE[-1].packed_requested = True
        return None
    find_packed_sequence_indices._hp_cp = True  # type: ignore[attr-defined]
    masking.find_packed_sequence_indices = find_packed_sequence_indices


def _cp_inputs(state: CPState, names: list[str], accepts: set[str], args: tuple[Any, ...],
               kwargs: dict[str, Any], seq_shards: int = 1) -> dict[str, Any]:
    """This forward's keyword arguments under cp (see the module docstring)."""
    kwargs = {**dict(zip(names, args, strict=False)), **kwargs}
    if kwargs.get("labels") is not None:
        raise PlanError([error(
            "runtime.cp_labels", "labels",
            "under context parallelism the model cannot shift labels itself (each rank "
            "holds chunks of the sequence)",
            hint="pass pre-shifted labels to hpcodegen.runtime.cp.shard_batch and take "
                 "batch.loss(logits)")])
    tokens = kwargs.get("input_ids")
    tokens = tokens if tokens is not None else kwargs.get("inputs_embeds")
    if not isinstance(tokens, torch.Tensor):
        state.batch = None
        return kwargs
    mask = kwargs.get("attention_mask")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() != 2):
        raise PlanError([error("runtime.cp_mask", "attention_mask",
                               "under context parallelism attention_mask must be the 2-D "
                               "[batch, local seq] padding mask")])
    positions = kwargs.get("position_ids")
    state.batch = batch_view(state, tokens, mask, positions, seq_shards)
    state.packed_requested = False
    if positions is None:
        kwargs["position_ids"] = state.batch.q_index.unsqueeze(0).expand(tokens.shape[0], -1)
    if "use_cache" in accepts:
        kwargs["use_cache"] = False
    return kwargs


def install_context_parallel(model: nn.Module, attention: Iterable[str], group: Any,
                             size: int, rank: int, layout: str,
                             seq_multiple: int = 1, ulysses: int = 1) -> CPState:
    """Phase CP (see the module docstring); returns the model's :class:`CPState`.

    ``attention``: the FQNs of the attention modules whose ``inner_wrapper`` will bind their
    CP kernel; each gets the state as ``_hp_cp``. ``ulysses``: cp ranks per Ulysses
    all-to-all (1 all-gather, ``size`` Ulysses, between: the hybrid's sub-groups are made
    here, :func:`hpcodegen.runtime.cp.ulysses.ulysses_groups`).
    """
    if cp_state(model) is not None:
        raise PlanError([error("runtime.reinstall", type(model).__name__,
                               "context parallelism already installed")])
    if ulysses < 1 or size % ulysses:
        raise PlanError([error("runtime.cp_ulysses", type(model).__name__,
                               f"a Ulysses degree of {ulysses} does not divide cp = {size}")])
    state = CPState(Comm(group), size, rank, layout, seq_multiple, ulysses)
    if ulysses == 1:
        state.kv = kv_gather(state.comm)
    elif ulysses == size:
        state.a2a, state.a2a_rank = state.comm, rank
    else:
        from hpcodegen.runtime.cp.ulysses import ulysses_groups

        a2a, across, state.a2a_rank = ulysses_groups(group, ulysses)
        state.a2a, state.kv = Comm(a2a), kv_gather(Comm(across))
    watch_packed_detection()
    config = _own_config(model)
    config._attn_implementation = register(state)
    names = _positional_names(model)
    try:
        accepts = set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        accepts = set(names)
    model.forward = _cp_forward(model.forward, state, names, accepts)
    model.__dict__[STATE_ATTR] = state
    for fqn in attention:
        module = model.get_submodule(fqn)
        module.__dict__["_hp_cp"] = state
        state.causal = state.causal and bool(getattr(module, "is_causal", True))
    return state


__all__ = ["STATE_ATTR", "batch_view", "cp_call", "cp_state", "install_context_parallel"]
