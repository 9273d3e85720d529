"""The text of a generated ``forward`` body, per boundary form (pure: strings only).

The body performs the declared transitions around ``self._forward_impl`` (the original
forward, kept byte-for-byte). tp_collective forms call one bare collective per transition
(``hidden_states = self._hp_tp.all_gather(hidden_states, dim=1)``) so a reviewer reads every
communication in the diff; generic forms hand the arguments to the bound engine. Each
transition gets a comment: the classifier's note. Which of the two a tp_collective verdict
gets is :func:`hpcodegen.plan.lowering.lowering_gates` (the rule verify applies too).
"""

from __future__ import annotations

from collections.abc import Sequence

from hpcodegen.plan.classify import BoundaryForm, TPOp, Transition
from hpcodegen.plan.lowering import ForwardSignature as Signature


def _op_call(op: TPOp, arg: str) -> str:
    if op.kind == "identity":
        return f"self._hp_tp.to_local({arg})"
    if op.kind == "all_reduce":
        return f"self._hp_tp.all_reduce({arg})"
    return f"self._hp_tp.{op.kind}({arg}, dim={op.dim})"


def _comment(t: Transition) -> str:
    return f"# {t.note}" if t.note else f"# {t.name}: unchanged ==> to_local"


def _call_args(sig: Signature) -> str:
    parts = list(sig.positional) + [f"{k}={k}" for k in sig.kwonly]
    if sig.varkw:
        parts.append(f"**{sig.varkw}")
    return ", ".join(parts)


def tp_collective_body(form: BoundaryForm, sig: Signature, deferred: bool) -> list[str]:
    """Lines of a tp_collective forward body (no indentation)."""
    lines = ["# [HP BOUNDARY] tp_collective: transitions frozen in codegen_meta.json"]
    for t in form.inputs:
        lines += [_comment(t), f"{t.name} = {_op_call(t.op, t.name)}"]
    lines.append(f"outputs = self._forward_impl({_call_args(sig)})")
    for t in form.outputs:
        if t.is_identity or t.op is None:
            continue
        lines.append(_comment(t))
        if sig.returns == "tuple":
            lines += [f"_hp_output_0 = {_op_call(t.op, 'outputs[0]')}",
                      "outputs = (_hp_output_0, *outputs[1:])"]
        else:
            lines.append(f"outputs = {_op_call(t.op, 'outputs')}")
    if deferred:
        lines.append("outputs = self._hp_deferred_bias(outputs)")
    lines.append("return outputs")
    return lines


def generic_body(form: BoundaryForm, sig: Signature, deferred: bool,
                 reasons: Sequence[str] = ()) -> list[str]:
    """Lines of a generic forward body: the bound engine redistributes in and out."""
    lines = ["# [HP BOUNDARY] generic: transitions frozen in codegen_meta.json"]
    lines += [f"# generic because {r}" for r in (*form.reasons, *reasons)]
    lines += [f"# {t.note}" for t in form.inputs if t.note]
    positional = list(sig.positional) + ([f"*{sig.varargs}"] if sig.varargs else [])
    pos = "(" + ", ".join(positional) + ("," if len(positional) == 1 else "") + ")"
    kw = [f'"{k}": {k}' for k in sig.kwonly] + ([f"**{sig.varkw}"] if sig.varkw else [])
    lines.append(
        f"args, kwargs = self._hp_boundary.redistribute_inputs(({pos}, {{{', '.join(kw)}}}))")
    lines.append("outputs = self._forward_impl(*args, **kwargs)")
    lines += [f"# {t.note}" for t in form.outputs if t.note]
    lines.append("outputs = self._hp_boundary.redistribute_outputs(outputs)")
    if deferred:
        lines.append("outputs = self._hp_deferred_bias(outputs)")
    lines.append("return outputs")
    return lines
