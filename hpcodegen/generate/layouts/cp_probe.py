"""With ``--cp``: one fake-tensor forward that finds what context parallelism must know.

Context parallelism cuts the sequence over cp ranks everywhere; it is exact only when
every token mixer is an attention that goes through transformers' attention interface
(whose K/V the runtime gathers and whose mask it rebuilds at global positions). The
generator runs the meta-device model once under torch's fake tensor mode (shapes only, no
data) on ``(3, L)`` token ids, ``L`` a prime no config field equals, with:

* the attention interface watched (:func:`hpcodegen.tracer.attention.watch_attention`):
  which modules call it, their K/V shapes and the keyword arguments they pass (a softcap
  needs the eager kernel; a ``position_bias`` is a bias built for the local sequence); the
  model's own kernel still runs;
* a dispatch mode that flags, *outside* those calls, every op on a floating tensor (grad or
  not: a sparse-attention indexer scores keys without one) that mixes values along a dim
  of length ``L`` (the model gets ``position_ids`` as the cp runtime passes them): a matmul
  contracting it, a convolution sliding over it, a cumulative or reducing op along it, a
  pad/roll/flip shifting it. Those are token mixers CP cannot make exact (recurrent and
  state-space mixers, a time shift, attention computed by the model itself), named with
  the innermost module running them;
* hooks recording every boundary's input and output shapes, so each value's sequence dim
  (``L``, or ``3 L`` for flattened tokens) is known for its ``cp`` placement.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcodegen.tracer.hooks import Recording

BATCH = 3
_PRIMES = (97, 101, 103, 107, 109, 113, 127, 131, 137, 139)


@dataclass
class AttentionCall:
    """One module's call of the attention interface."""

    key: tuple[int, ...]
    value: tuple[int, ...]
    query: tuple[int, ...]
    softcap: bool
    position_bias: bool
    is_causal: bool


@dataclass
class CPProbe:
    """What the probe forward saw (see the module docstring)."""

    length: int
    attention: dict[str, AttentionCall] = field(default_factory=dict)
    #: ``(module FQN, op description)`` of token mixing outside the attention interface
    mixing: list[tuple[str, str]] = field(default_factory=list)
    #: the model overlays its own mask function (image tokens, ...)
    mask_overlay: bool = False
    #: attention modules that hand their kernel another mask than transformers built (a
    #: sparse-attention indexer's selection folded in, ...)
    own_mask: list[str] = field(default_factory=list)
    #: ``{(fqn, side, name): shape}`` of the boundary values
    shapes: dict[tuple[str, str, str], tuple[int, ...]] = field(default_factory=dict)
    #: the forward failed on fake tensors (data-dependent code): why
    failure: str | None = None
    #: the model's configured attention implementation
    implementation: str | None = None


def probe_length(config: Mapping[str, Any]) -> int:
    """A prime sequence length no integer of the config equals."""
    used: set[int] = set()

    def walk(value: Any) -> None:
        if isinstance(value, Mapping):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, int) and not isinstance(value, bool):
            used.add(value)
    walk(config)
    return next((p for p in _PRIMES if p not in used and p * BATCH not in used), 151)


def _mixing_ops() -> Any:
    """``{op: rule}`` of the aten ops the detector inspects."""
    import torch

    aten = torch.ops.aten
    contract = {aten.mm.default: (0, 1), aten.bmm.default: (0, 1), aten.addmm.default: (1, 2),
                aten.baddbmm.default: (1, 2)}
    along = {aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default,
             aten.topk.default, aten.sort.default, aten.sort.stable, aten.kthvalue.default,
             aten.argmax.default, aten.argmin.default}
    reduce = {aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default,
              aten._softmax.default, aten._log_softmax.default, aten._safe_softmax.default,
              aten.logsumexp.default, aten.var.correction, aten.prod.dim_int}
    return contract, along, reduce


def _active(t: Any) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _dims(value: Any, ndim: int) -> list[int]:
    if value is None:
        return list(range(ndim))
    dims = value if isinstance(value, (list, tuple)) else [value]
    return [d % ndim for d in dims] if ndim else []


def mixes(func: Any, args: tuple, kwargs: Mapping[str, Any], length: int,
          rules: Any) -> str | None:
    """Why ``func`` mixes values along a dim of ``length`` on an activation, or None."""
    import torch

    aten = torch.ops.aten
    contract, along, reduce = rules
    name = str(func).removeprefix("aten.")
    if func in contract:
        a, b = args[contract[func][0]], args[contract[func][1]]
        if (_active(a) or _active(b)) and a.shape[-1] == length:
            return f"{name} contracts the sequence"
    elif func is aten.convolution.default:
        x, w = args[0], args[1]
        if _active(x) and any(s == length for s in x.shape[2:]) and w.numel() and \
                any(k > 1 for k in w.shape[2:]):
            return f"{name} slides over the sequence"
    elif func in along or func in reduce:
        x = args[0]
        at = 2 if func in (aten.topk.default, aten.kthvalue.default) else 1  # (x, k, dim)
        dim = args[at] if len(args) > at else kwargs.get("dim", -1 if at == 2 else None)
        if _active(x) and any(x.shape[d] == length for d in _dims(dim, x.dim())):
            return f"{name} along the sequence"
    elif func in (aten.constant_pad_nd.default, aten.roll.default, aten.flip.default):
        x = args[0]
        if _active(x) and any(s == length for s in x.shape):
            return f"{name} shifts along the sequence"
    elif "scaled_dot_product" in name and _active(args[0]):
        return f"{name} outside the attention interface"
    return None


class _Recorder:
    """Module stack, attention calls, mixing ops: the probe's state during the forward."""

    def __init__(self, model: Any, length: int) -> None:
        self.names = {id(m): fqn for fqn, m in model.named_modules()}
        self.stack: list[str] = []
        self.inside = 0
        self.result = CPProbe(length)
        #: the masks transformers built in this forward
        self.masks: list[Any] = []
        #: the boundaries watched and their tensors (the tracer's hooks)
        self.watched: dict[str, Any] = {}
        self.traced = Recording()

    def where(self) -> str:
        return self.stack[-1] if self.stack else ""


def _on_call(rec: _Recorder) -> Any:
    from contextlib import contextmanager

    @contextmanager
    def record(module: Any, query: Any, key: Any, value: Any, kwargs: dict[str, Any],
               mask: Any = None) -> Any:
        fqn = rec.names.get(id(module), type(module).__name__)
        if mask is not None and not any(mask is m for m in rec.masks) and \
                fqn not in rec.result.own_mask:
            rec.result.own_mask.append(fqn)
        rec.result.attention.setdefault(fqn, AttentionCall(
            tuple(key.shape), tuple(value.shape), tuple(query.shape),
            kwargs.get("softcap") is not None, kwargs.get("position_bias") is not None,
            bool(getattr(module, "is_causal", True))))
        rec.inside += 1
        try:
            yield
        finally:
            rec.inside -= 1
    return record


def _on_mask(rec: _Recorder) -> Any:
    def record(kwargs: dict[str, Any], mask: Any) -> None:
        if kwargs.get("use_vmap"):
            rec.result.mask_overlay = True
        rec.masks.append(mask)
    return record


def _dispatch_mode(rec: _Recorder) -> Any:
    """The tracer's op watcher (:func:`hpcodegen.tracer.ops.watch_ops`) flagging token
    mixing outside the attention interface's calls."""
    from hpcodegen.tracer.ops import watch_ops

    rules = _mixing_ops()

    def observe(func: Any, args: tuple, kwargs: Mapping[str, Any], _out: Any) -> None:
        if not rec.inside:
            why = mixes(func, args, kwargs, rec.result.length, rules)
            if why and len(rec.result.mixing) < 50:
                rec.result.mixing.append((rec.where(), why))

    return watch_ops(observe)


def _shape_hooks(model: Any, boundaries: Iterable[str], rec: _Recorder) -> list[Any]:
    """The tracer's hooks on every boundary (:func:`hpcodegen.tracer.hooks.record_tensors`);
    :func:`_boundary_shapes` reads them back."""
    from hpcodegen.tracer.hooks import record_tensors

    modules = dict(model.named_modules())
    rec.watched = {fqn: modules[fqn] for fqn in boundaries if fqn in modules}
    return record_tensors(rec.watched, rec.traced)


def _boundary_shapes(rec: _Recorder) -> dict[tuple[str, str, str], tuple[int, ...]]:
    """``{(fqn, "in", name) | (fqn, "out", "output"): shape}``: inputs named by the
    forward's own parameters (not ``**kwargs`` entries), the first output as ``output``."""
    shapes: dict[tuple[str, str, str], tuple[int, ...]] = {}
    params: dict[str, set[str]] = {}
    for (fqn, side, key), (shape, _) in rec.traced.tensors.items():
        if side == "out":
            if key == 0:
                shapes[(fqn, "out", "output")] = shape
            continue
        if fqn not in params:
            try:
                sig = inspect.signature(rec.watched[fqn].forward)
                params[fqn] = {p.name for p in sig.parameters.values()
                               if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
            except (TypeError, ValueError):
                params[fqn] = set()
        if key in params[fqn]:
            shapes[(fqn, "in", key)] = shape
    return shapes


def _stack_hooks(model: Any, rec: _Recorder) -> list[Any]:
    def enter(mod: Any, _args: Any) -> None:
        rec.stack.append(rec.names.get(id(mod), ""))

    def leave(_mod: Any, _args: Any, _out: Any) -> None:
        if rec.stack:
            rec.stack.pop()
    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    return handles


def _position_kwargs(model: Any, length: int) -> dict[str, Any]:
    """``position_ids`` as the cp runtime always passes them (a model's own default, OPT's
    cumulative sum of the mask, never runs under cp)."""
    import torch

    try:
        accepts = "position_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        accepts = False
    device = next((p.device for p in model.parameters()), torch.device("meta"))
    positions = torch.arange(length, device=device).expand(BATCH, -1)
    return {"position_ids": positions} if accepts else {}


def probe_cp(model: Any, config: Mapping[str, Any], boundaries: Iterable[str]) -> CPProbe:
    """Run the probe forward (module docstring); the model is left as it was."""
    from hpcodegen.tracer.attention import watch_attention
    from hpcodegen.tracer.hooks import removed
    from hpcodegen.tracer.model import forward

    length = probe_length(config)
    rec = _Recorder(model, length)
    try:
        with removed(_shape_hooks(model, boundaries, rec) + _stack_hooks(model, rec)), \
                watch_attention(model, _on_call(rec), _on_mask(rec)) as implementation:
            rec.result.implementation = implementation
            forward(model, BATCH, length, fake=True, watch=_dispatch_mode(rec),
                    extra=_position_kwargs(model, length))
    except Exception as exc:  # data-dependent model code: reported as the refusal's reason
        rec.result.failure = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    rec.result.shapes = _boundary_shapes(rec)
    return rec.result


__all__ = ["AttentionCall", "CPProbe", "mixes", "probe_cp", "probe_length"]
