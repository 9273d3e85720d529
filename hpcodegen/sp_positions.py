"""Sequence parallelism's two changes to a model's own forward: global default position
ids and full-length masks (the runtime installs them; ``generate --sp`` runs with them).

With sequence parallelism the token embedding's output leaves sharded on dim 1
(:meth:`hpcodegen.plan.types.PlanEntry.output_sequence_sharded` of a
:func:`~hpcodegen.plan.entry.takes_token_ids` class), and HF's ``*Model.forward`` derives
default ``position_ids`` from ``inputs_embeds.shape[1]`` (now the local length). The parent
forward is wrapped to pass the global ``arange(seq_len)`` built from ``input_ids``
(:func:`install_default_position_ids`), and the mask builders of transformers see the full
length while it runs (:func:`full_length_masks`), so eager, sliding-window and chunked
masks match the gathered sequence attention runs on.

The runtime's install (:mod:`hpcodegen.runtime.boundaries`) and generate's sharded-shape
run (:mod:`hpcodegen.generate.checks.sp_check`) both use it, so the check runs what will run.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

#: ``[n]``: the full sequence length while a sequence-parallel model forward runs, else
#: ``[None]``. A one-item list, not a ContextVar: dynamo traces a list's item assignment
#: (torch.compile keeps the forward in one graph) but breaks the graph on ContextVar methods.
_FULL_SEQUENCE: list[int | None] = [None]
#: the names transformers' mask builders give the activations they size the mask by
_EMBEDS_ARGS = ("inputs_embeds", "input_embeds")


def _slots(sig: inspect.Signature) -> dict[str, int]:
    """``{name: position}`` of a signature's positional parameters, found once when a
    wrapper is made: per call, ``Signature.bind`` would break torch.compile's graph on the
    Signature's mapping proxy once a forward pre-hook has mutated a module's dicts."""
    positional = [n for n, p in sig.parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return {name: i for i, name in enumerate(positional)}


def _argument(name: str, slots: dict[str, int], args: tuple, kwargs: dict[str, Any]) -> Any:
    """The value a call passes for ``name``, by keyword or at its slot; None when not passed."""
    if name in kwargs:
        return kwargs[name]
    slot = slots.get(name)
    return args[slot] if slot is not None and slot < len(args) else None


def _with_argument(name: str, value: Any, slots: dict[str, int], args: tuple,
                   kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` with ``name`` set to ``value`` where the call passed it (its slot
    when given positionally), else as a keyword."""
    slot = slots.get(name)
    if name not in kwargs and slot is not None and slot < len(args):
        return (*args[:slot], value, *args[slot + 1:]), kwargs
    return args, {**kwargs, name: value}


def full_length_masks(namespace: dict[str, Any]) -> list[str]:
    """Make the mask builders a modeling module calls size their masks by the full sequence.

    With sequence parallelism the model forward sees the embedding's local slice, and
    transformers' ``create_*mask`` functions (``transformers.masking_utils``) read the query
    length from ``inputs_embeds.shape[1]``: an eager, flex, sliding-window or chunked mask
    would be built for the local length, while attention runs on the gathered sequence. Each
    such function named in ``namespace`` (the modeling module's globals) is wrapped: while
    :data:`_FULL_SEQUENCE` is set it sees a zero-copy ``expand`` of ``inputs_embeds`` to the
    full length (the builders read only its batch size, length, dtype and device). Outside a
    sequence-parallel forward the wrapper calls the builder unchanged. Returns the names.
    """
    done = []
    for name, fn in list(namespace.items()):
        if not callable(fn) or getattr(fn, "__module__", "") != "transformers.masking_utils":
            continue
        if getattr(fn, "_hp_full_length", False):
            done.append(name)
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        arg = next((a for a in _EMBEDS_ARGS if a in params), None)
        if arg is None:
            continue
        namespace[name] = _full_length_builder(fn, arg)
        done.append(name)
    return done


def _full_length_builder(fn: Any, arg: str) -> Any:
    slots = _slots(inspect.signature(fn))

    @functools.wraps(fn)
    def full_length_mask(*args: Any, **kwargs: Any) -> Any:
        full = _FULL_SEQUENCE[0]
        if full is None:
            return fn(*args, **kwargs)
        embeds = _argument(arg, slots, args, kwargs)
        if isinstance(embeds, torch.Tensor) and embeds.dim() >= 2 and embeds.shape[1] != full:
            embeds = embeds[:, :1].expand(embeds.shape[0], full, *embeds.shape[2:])
            args, kwargs = _with_argument(arg, embeds, slots, args, kwargs)
        return fn(*args, **kwargs)

    full_length_mask._hp_full_length = True  # type: ignore[attr-defined]
    return full_length_mask


@contextlib.contextmanager
def full_sequence(length: int) -> Iterator[None]:
    """Inside: transformers' mask builders size their masks by ``length`` (the global
    sequence), as inside a wrapped forward; for callers that pass the global
    ``position_ids`` themselves (a pipeline stage fed hidden states, not token ids)."""
    outer = _FULL_SEQUENCE[0]
    _FULL_SEQUENCE[0] = int(length)
    try:
        yield
    finally:
        _FULL_SEQUENCE[0] = outer


def install_default_position_ids(parent: nn.Module) -> bool:
    """Wrap ``parent.forward`` for sequence parallelism; False if it can't.

    The wrapper passes global default ``position_ids`` (``arange`` of the full length, after
    what the cache has seen) and, while the forward runs, has the masks built for the full
    sequence (:func:`full_length_masks`)."""
    if getattr(parent, "_hp_position_ids_wrapped", False):
        return True
    original = parent.forward
    sig = inspect.signature(original)
    if "input_ids" not in sig.parameters or "position_ids" not in sig.parameters:
        return False
    full_length_masks(inspect.unwrap(type(parent).forward).__globals__)

    slots = _slots(sig)

    def sp_position_ids_forward(*args: Any, **kwargs: Any) -> Any:
        input_ids = _argument("input_ids", slots, args, kwargs)
        if input_ids is None:
            return original(*args, **kwargs)
        if _argument("position_ids", slots, args, kwargs) is None:
            cache = _argument("past_key_values", slots, args, kwargs)
            seen = cache.get_seq_length() if cache is not None else 0
            ids = (torch.arange(input_ids.shape[-1], device=input_ids.device)
                   + seen).unsqueeze(0)
            args, kwargs = _with_argument("position_ids", ids, slots, args, kwargs)
        outer = _FULL_SEQUENCE[0]
        _FULL_SEQUENCE[0] = int(input_ids.shape[-1])
        try:
            return original(*args, **kwargs)
        finally:
            _FULL_SEQUENCE[0] = outer

    parent.forward = sp_position_ids_forward
    parent._hp_position_ids_wrapped = True
    return True
