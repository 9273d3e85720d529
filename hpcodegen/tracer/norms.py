"""Which modules are norms, read off one forward of each on the meta device.

generate treats a norm apart (the lifter's sequence-parallel default, a norm over one
head's width inside an attention, a norm between a projection and the heads): what makes
a module one is what its forward computes, not what its class is called. A module is a
norm when, run alone on a meta tensor ``x`` of shape ``(2, 3, n)`` (``n`` the width of a
one-dim ``weight`` it holds itself, no child holding parameters):

* some op reduces a tensor derived from ``x`` over its last dim (a mean, sum, variance or
  vector norm over ``dim=-1``; a fused layer/RMS norm whose ``normalized_shape`` is
  ``[n]``): the output is ``x`` normalised over its last dim;
* some op combines a tensor derived from ``x`` with one derived from the weight (the
  scale, ``weight * x`` or Gemma's ``(1 + weight) * x``);
* the first output has ``x``'s shape and derives from both.

A module whose forward takes a second argument (a gated norm's ``gate``, mixed into what
it normalises) or does not run on one tensor alone is not one. Each module is traced
once (the verdict is kept per module object), and modules built alike share one trace
(:func:`_likeness`): a model's layers repeat the same few norms, and a process that builds
a model more than once (generate, then verify's model check) asks of the same classes
again; torch is imported inside the functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from weakref import WeakKeyDictionary

#: ops reducing their input over the dims of their ``dim`` argument
REDUCTIONS = frozenset({"aten.mean", "aten.sum", "aten.var", "aten.var_mean", "aten.std",
                        "aten.std_mean", "aten.linalg_vector_norm", "aten.norm"})
#: fused normalisations over the trailing dims of their ``normalized_shape`` argument
FUSED = frozenset({"aten.native_layer_norm", "aten.layer_norm", "aten.rms_norm",
                   "aten._fused_rms_norm"})
#: the batch and sequence of the traced input (3: no width a norm could mistake for it)
BATCH, SEQ = 2, 3

_VERDICTS: WeakKeyDictionary[Any, bool] = WeakKeyDictionary()
#: verdict per :func:`_likeness` key: one trace for all the modules built alike
_ALIKE: dict[tuple, bool] = {}
#: attribute values a likeness key takes as they are
_PLAIN = (bool, int, float, str, type(None))


def is_norm(module: Any) -> bool:
    """Whether ``module`` normalises its input over the last dim with a weight of that
    width (module docstring); traced once per module, or once for all modules alike."""
    verdict = _VERDICTS.get(module)
    if verdict is None:
        key = _likeness(module)
        verdict = _ALIKE.get(key) if key is not None else None
        if verdict is None:
            verdict = _traced(module)
            if key is not None:
                _ALIKE[key] = verdict
        _VERDICTS[module] = verdict
    return verdict


def _likeness(module: Any) -> tuple | None:
    """Everything :func:`_traced` reads of ``module``, as a hashable key: its class and the
    class's ``forward``, each plain attribute (``eps``, a ``(1 + weight)`` offset flag, a
    ``normalized_shape`` tuple) and each parameter's and buffer's shape, dtype, device and
    kind. Two modules with one key run the same code on the same inputs, so one trace
    answers both. None (trace this one alone) when the module holds anything a key cannot
    compare: a child, a forward or hook of its own, any attribute of another type."""
    import torch

    if not isinstance(module, torch.nn.Module):
        return None
    parts: list[Any] = [type(module), getattr(type(module), "forward", None)]
    for name, value in sorted(vars(module).items()):
        if name in ("_parameters", "_buffers"):
            parts.append((name, tuple(
                (k, None) if t is None else
                (k, type(t), tuple(t.shape), t.dtype, t.device.type, t.requires_grad)
                for k, t in value.items())))
        elif isinstance(value, _PLAIN):
            parts.append((name, value))
        elif isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN) for v in value):
            parts.append((name, type(value), tuple(value)))
        elif isinstance(value, (dict, set)) and not value:
            parts.append((name, type(value)))  # no child, no hook, no marker
        else:
            return None
    return tuple(parts)


def _argument(op: Any, args: tuple, kwargs: Mapping[str, Any], name: str) -> Any:
    """The value of ``op``'s argument ``name`` in one call, positional or keyword."""
    schema = getattr(op, "_schema", None)
    for i, arg in enumerate(getattr(schema, "arguments", ())):
        if arg.name == name:
            return args[i] if i < len(args) else kwargs.get(name)
    return None


def _reduces_last(op: Any, args: tuple, kwargs: Mapping[str, Any], operand: Any,
                  width: int) -> bool:
    """Whether ``op`` reduces ``operand`` (its first argument) over its last dim only."""
    from hpcodegen.tracer.ops import op_name

    name = op_name(op)
    if name in FUSED:
        shape = _argument(op, args, kwargs, "normalized_shape")
        return shape is not None and list(shape) == [width]
    if name not in REDUCTIONS or not args or args[0] is not operand:
        return False
    dims = _argument(op, args, kwargs, "dim")
    dims = [dims] if isinstance(dims, int) else list(dims or ())
    last = operand.dim() - 1
    return len(dims) == 1 and dims[0] % max(operand.dim(), 1) == last \
        and operand.shape[-1] == width


def argument_names(module: Any) -> list[str]:
    """The parameters of ``module.forward`` (``self`` bound); ``["input"]`` when unreadable."""
    import inspect

    try:
        return list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return ["input"]


def _traced(module: Any) -> bool:
    """One forward of ``module`` alone on a meta ``(BATCH, SEQ, n)`` input, watched."""
    import torch

    from hpcodegen.tracer.dataflow import all_on_meta
    from hpcodegen.tracer.hooks import outputs_of
    from hpcodegen.tracer.ops import tensors, watch_ops

    weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not weight.is_floating_point() \
            or any(True for child in module.children() for _ in child.parameters()):
        return False
    if len(argument_names(module)) != 1:
        return False  # a second input (a gate) mixes into what it normalises
    width = weight.shape[0]
    seen = {"reduced": False, "scaled": False}

    with all_on_meta(module):
        weight = module._parameters["weight"]
        x = torch.zeros(BATCH, SEQ, width, dtype=weight.dtype, device="meta")
        from_x: dict[int, Any] = {id(x): x}
        from_w: dict[int, Any] = {id(weight): weight}

        def observe(op: Any, args: tuple, kwargs: Mapping[str, Any], out: Any) -> None:
            operands = tensors((args, dict(kwargs)))
            on_x = [t for t in operands if id(t) in from_x]
            on_w = any(id(t) in from_w for t in operands)
            if on_x and _reduces_last(op, args, kwargs, on_x[0], width):
                seen["reduced"] = True
            if on_x and on_w:
                seen["scaled"] = True
            for t in tensors(out):
                if on_x:
                    from_x[id(t)] = t
                if on_w:
                    from_w[id(t)] = t

        try:
            with torch.no_grad(), watch_ops(observe):
                out = outputs_of(module(x))[:1]
        except Exception:  # needs more than one tensor, or cannot run on meta: no norm
            return False
    return bool(seen["reduced"] and seen["scaled"] and out
                and isinstance(out[0], torch.Tensor) and tuple(out[0].shape) == tuple(x.shape)
                and id(out[0]) in from_x and id(out[0]) in from_w)
