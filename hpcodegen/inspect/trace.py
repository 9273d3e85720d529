"""Boundary tensor shapes from a forward of the real model on the meta device (lazy torch).

``inspect-plan --hf-config`` needs the size of every tensor a collective moves. Guessing them
from config formulas breaks on the first model that reshapes differently, so the model is
built from its HF config on the meta device and run once by the tracer
(:mod:`hpcodegen.tracer`: real structure, no memory, no weights); its hooks record each
boundary's inputs by name and outputs by position, on meta ``input_ids`` of
``(batch, seq)``. The model is unsharded, so the shapes are the *full* tensors. torch and
transformers are imported only inside the tracer's functions.

Note: attention runs as ``eager`` with an explicit all-ones mask, because transformers' mask
shortcuts read tensor values (``.item()``), which meta tensors do not have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcodegen.errors import Finding, PlanError, error, warning
from hpcodegen.tracer.hooks import Recording, TensorInfo, record_tensors, removed
from hpcodegen.tracer.model import build, forward, use_eager

__all__ = ["TensorInfo", "TraceResult", "TraceTarget", "trace_boundaries"]


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
    #: kernel (``[batch, kv_heads, seq, head_dim]``, before any GQA expansion), the query
    #: and the kernel's output ``[batch, seq, heads, head_dim]`` (Ulysses' all_to_alls)
    attention: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)


def _run_forward(model: Any, batch: int, seq: int, result: TraceResult | None = None) -> None:
    """The tracer's forward, recording the K/V shapes each attention module hands its
    kernel (:func:`hpcodegen.tracer.attention.watch_attention`) into ``result``."""
    import contextlib

    from hpcodegen.tracer.attention import watch_attention

    names = {id(m): fqn for fqn, m in model.named_modules()}

    @contextlib.contextmanager
    def record(module: Any, query: Any, key: Any, value: Any, _kw: Any, _mask: Any) -> Any:
        fqn = names.get(id(module), "")
        if result is not None:
            result.attention.setdefault((fqn, "query"), tuple(query.shape))
            result.attention.setdefault((fqn, "key"), tuple(key.shape))
            result.attention.setdefault((fqn, "value"), tuple(value.shape))
            b, h, s, _ = query.shape
            result.attention.setdefault((fqn, "output"), (b, s, h, value.shape[-1]))
        yield
    with watch_attention(model, record):
        forward(model, batch, seq, mask=True)


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
    model = build(config)
    use_eager(model)
    modules = dict(model.named_modules())
    result = TraceResult()
    watched: dict[str, Any] = {}
    for target in targets:
        module = modules.get(target.fqn)
        if module is None:
            result.findings.append(error("trace.missing_module", target.fqn,
                                         "the plan names a module the model built from "
                                         "--hf-config does not have"))
            continue
        watched[target.fqn] = module
    recording = Recording()
    lone = {t.fqn: t.inputs[0] for t in targets if t.inputs}
    try:
        with removed(record_tensors(watched, recording, lone)):
            _run_forward(model, batch, seq, result)
    except Exception as exc:  # any model code may fail on meta; report, never a traceback
        if isinstance(exc, OverflowError) or "overflow" in str(exc).lower():
            # an activation of batch x seq (x seq for attention scores) past what a tensor
            # can hold: the request is impossible, not the plan wrong
            from hpcodegen.errors import UsageError

            raise UsageError([error("inspect.usage", "--batch/--seq",
                                    f"--batch {batch} --seq {seq}: the model's activations "
                                    f"at this size exceed what a tensor can hold "
                                    f"({type(exc).__name__}: {str(exc)[:160]})",
                                    expected="a batch and sequence a model can run")]) from None
        raise PlanError([error("trace.forward_failed", "",
                               f"meta-device forward failed: {type(exc).__name__}: {exc}",
                               hint="check --hf-config, --batch and --seq")]) from None
    _collect(targets, recording, result)
    _missing_names(targets, modules, result)
    return result


def _collect(targets: Sequence[TraceTarget], recording: Recording,
             result: TraceResult) -> None:
    """The recorded tensors under the targets' input and output names."""
    for target in targets:
        if target.fqn in recording.calls:
            result.calls[target.fqn] = recording.calls[target.fqn]
        sides = [("in", n, n) for n in target.inputs] + \
            [("out", n, i) for n, i in target.outputs]
        for side, name, key in sides:
            info = recording.tensors.get((target.fqn, side, key))
            if info is not None:
                result.tensors.setdefault((target.fqn, side, name), info)


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
