"""Boundary tensor shapes from a forward of the real model on the meta device (lazy torch).

``inspect-plan --hf-config`` needs the size of every tensor a collective moves. Guessing them
from config formulas breaks on the first model that reshapes differently, so the model is
built from its HF config on the meta device (:func:`hpcodegen.hf.build_meta_model`: real
structure, no memory, no weights), hooks record each boundary's inputs and outputs by name,
and one forward runs on meta ``input_ids`` of ``(batch, seq)``. The model is unsharded, so the
shapes are the *full* tensors. torch and transformers are imported only inside these functions.

Note: attention runs as ``eager`` with an explicit all-ones mask, because transformers' mask
shortcuts read tensor values (``.item()``), which meta tensors do not have.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hpcodegen.errors import Finding, HpcodegenError, PlanError, error, warning
from hpcodegen.hf import no_cache_kwargs

#: ``(shape, itemsize)``; itemsize is None for floating tensors (they take ``--dtype``)
TensorInfo = tuple[tuple[int, ...], int | None]


@dataclass(frozen=True)
class TraceTarget:
    """A boundary to record: its input names and its output names with tuple positions."""

    fqn: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, int], ...]


@dataclass
class TraceResult:
    """Shapes per ``(fqn, side, name)``, calls per FQN, and what could not be recorded."""

    tensors: dict[tuple[str, str, str], TensorInfo] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    #: ``{(attention module fqn, "key" | "value"): shape}`` as handed to the attention
    #: kernel (``[batch, kv_heads, seq, head_dim]``, before any GQA expansion)
    attention: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)


def _info(value: Any) -> TensorInfo | None:
    import torch

    if isinstance(value, torch.Tensor):
        return tuple(value.shape), None if value.is_floating_point() else value.element_size()
    return None


def _pick_output(output: Any, index: int) -> Any:
    import torch

    if isinstance(output, torch.Tensor):
        return output if index == 0 else None
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    if isinstance(output, (tuple, list)) and index < len(output):
        return output[index]
    return None


def _hooks(module: Any, target: TraceTarget, result: TraceResult) -> list[Any]:
    try:
        sig: inspect.Signature | None = inspect.signature(module.forward)
    except (TypeError, ValueError):
        sig = None

    def pre(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        result.calls[target.fqn] = result.calls.get(target.fqn, 0) + 1
        named: dict[str, Any] = dict(kwargs)
        if sig is not None:
            try:
                bound = sig.bind_partial(*args, **kwargs).arguments
            except TypeError:
                bound = {}
            for key, value in bound.items():
                if sig.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
                    named.update(value)
                else:
                    named[key] = value
        elif args:
            named.setdefault(target.inputs[0] if target.inputs else "input", args[0])
        for name in target.inputs:
            info = _info(named.get(name))
            if info is not None:
                result.tensors.setdefault((target.fqn, "in", name), info)

    def post(_mod: Any, _args: Any, _kwargs: Any, output: Any) -> None:
        for name, index in target.outputs:
            info = _info(_pick_output(output, index))
            if info is not None:
                result.tensors.setdefault((target.fqn, "out", name), info)

    return [module.register_forward_pre_hook(pre, with_kwargs=True),
            module.register_forward_hook(post, with_kwargs=True)]


def _use_eager(model: Any) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    try:
        if callable(setter):
            setter("eager")
            return
    except (ValueError, TypeError, AttributeError):
        pass
    model.config._attn_implementation = "eager"


def _stub_experts(model: Any) -> list[Any]:
    """Mixture-of-experts ``experts`` modules run shape-only on the meta device; returns them.

    Their kernels are data-dependent (which experts a token hits: ``nonzero``, grouped
    matmuls with per-expert offsets), which the meta device cannot run; their contract in
    transformers 5.x (the attributes ``use_experts_implementation`` sets) is an output of the
    hidden states' shape, which is all a trace needs.
    """
    import torch

    stubbed = []
    for module in model.modules():
        if hasattr(module, "is_concatenated") and hasattr(module, "has_gate"):
            module.forward = lambda hidden_states, *_a, **_k: torch.zeros_like(hidden_states)
            stubbed.append(module)
    return stubbed


@contextmanager
def experts_shape_only(model: Any) -> Iterator[None]:
    """:func:`_stub_experts` for the duration of a block (generate's meta-device runs keep
    using the model afterwards)."""
    stubbed = _stub_experts(model)
    try:
        yield
    finally:
        for module in stubbed:
            module.__dict__.pop("forward", None)


def _run_forward(model: Any, batch: int, seq: int, result: TraceResult | None = None) -> None:
    import contextlib

    import torch

    from hpcodegen.inspect.attention import watch_attention

    _stub_experts(model)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    mask = torch.ones(batch, seq, dtype=torch.long, device="meta")
    names = {id(m): fqn for fqn, m in model.named_modules()}

    @contextlib.contextmanager
    def record(module: Any, _q: Any, key: Any, value: Any, _kw: Any, _mask: Any) -> Any:
        fqn = names.get(id(module), "")
        if result is not None:
            result.attention.setdefault((fqn, "key"), tuple(key.shape))
            result.attention.setdefault((fqn, "value"), tuple(value.shape))
        yield
    with torch.no_grad(), watch_attention(model, record):
        model(input_ids=ids, attention_mask=mask, **no_cache_kwargs(model))


def _build(config: Mapping[str, Any]) -> Any:
    """The meta-device model; any failure of transformers' constructors becomes a PlanError."""
    from hpcodegen.hf import build_meta_model

    try:
        return build_meta_model(dict(config))
    except HpcodegenError:
        raise
    except Exception as exc:  # model code may reject a config in many ways; report it
        raise PlanError([error("trace.build_failed", "",
                               f"cannot build the model from --hf-config: "
                               f"{type(exc).__name__}: {exc}")]) from None


def trace_boundaries(config: Mapping[str, Any], targets: Sequence[TraceTarget],
                     batch: int, seq: int) -> TraceResult:
    """Run one meta-device forward and record every target's tensor shapes.

    Args:
        config: the HF config dict (``hpcodegen.hf.read_hf_config``).
        targets: the boundaries to record.
        batch, seq: the shape of the ``input_ids`` fed to the model.

    Returns:
        The recorded shapes; a target FQN missing from the model is an error finding, a
        name never seen (e.g. an input passed as None) a warning.

    Raises:
        PlanError: the model cannot be built or its forward fails on the meta device.
    """
    model = _build(config)
    _use_eager(model)
    modules = dict(model.named_modules())
    result = TraceResult()
    handles: list[Any] = []
    for target in targets:
        module = modules.get(target.fqn)
        if module is None:
            result.findings.append(error("trace.missing_module", target.fqn,
                                         "the plan names a module the model built from "
                                         "--hf-config does not have"))
            continue
        handles.extend(_hooks(module, target, result))
    try:
        _run_forward(model, batch, seq, result)
    except Exception as exc:  # any model code may fail on meta; report, never a traceback
        raise PlanError([error("trace.forward_failed", "",
                               f"meta-device forward failed: {type(exc).__name__}: {exc}",
                               hint="check --hf-config, --batch and --seq")]) from None
    finally:
        for handle in handles:
            handle.remove()
    _missing_names(targets, modules, result)
    return result


def _missing_names(targets: Sequence[TraceTarget], modules: Mapping[str, Any],
                   result: TraceResult) -> None:
    for target in targets:
        if target.fqn not in modules:
            continue
        sides = [("in", n) for n in target.inputs] + [("out", n) for n, _ in target.outputs]
        for side, name in sides:
            if (target.fqn, side, name) not in result.tensors:
                result.findings.append(warning(
                    "trace.no_tensor", target.fqn,
                    f"{side}put {name!r} was not a tensor in the traced forward; "
                    "its bytes are unknown"))
