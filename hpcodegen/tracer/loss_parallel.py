"""The loss-parallel rule on a built model: the logits after the head are only ever
touched entry by entry (lazy torch).

:mod:`hpcodegen.plan.loss_parallel` holds the rule's pure half (the flag against the plan)
and says why. This is the half that needs the model: its output head, and one meta-device
forward watched from the head's output onwards by a dispatch mode
(:class:`~hpcodegen.tracer.ops.DerivedTensors`). Every aten op that reads a tensor derived
from the head output must act on each vocabulary entry on its own (:func:`judge`):

* an op torch tags ``pointwise`` (``torch.Tag.pointwise``), or one of the few untagged
  ones named in :data:`UNTAGGED_ELEMENTWISE` with why each is safe, and no other operand
  spans the vocabulary (a full-vocab bias would be added to one rank's slice);
* an index, a write or a new dim that leaves the vocabulary dim whole and last
  (``logits[:, -1:]`` is fine, ``logits[..., :n]`` and ``logits[:, :, ids] = v`` are not);
* a factory that only reads the logits' shape, dtype and device (:data:`FACTORIES`).

Anything else (a softmax, a reduction, a reshape, a transpose) is refused, naming the op
and the model source line that ran it; and the ``logits`` the model returns must derive
from the head.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from hpcodegen.errors import Finding, PlanError, Severity, error, info
from hpcodegen.placement import REPLICATE
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.loss_parallel import (
    FLAG,
    GENERATE,
    Caller,
    declared,
    forward_needed,
    meta_caller,
)
from hpcodegen.plan.types import TP, Plan, PlanEntry
from hpcodegen.tracer.model import forward, use_eager
from hpcodegen.tracer.ops import DROP, FOLLOW, DerivedTensors, is_pointwise, op_name, tensors

#: aten ops (by overload packet) torch does not tag pointwise that still act on each entry
#: on its own, each with the reason
UNTAGGED_ELEMENTWISE = {
    "_to_copy": "a cast or a device move (.float(), .to(dtype)): entry by entry",
    "detach": "the same values, cut from autograd",
    "detach_": "the same values, cut from autograd",
    "alias": "the same values",
    "copy_": "writes its source entry by entry (logits[:, i:] = v arrives as slice + copy_)",
    "fill_": "one constant into every entry (logits[:, i] = c)",
    "masked_fill": "torch tags only masked_fill.Scalar; .Tensor takes a 0-dim value",
    "masked_fill_": "the in-place masked_fill, which torch leaves untagged",
    "rsub": "c - x; torch tags only rsub.Scalar",
}

#: ops that only read the logits' shape, dtype and device to make a new tensor: its
#: values do not derive from the logits
FACTORIES = frozenset({"new_zeros", "new_ones", "new_full", "new_empty",
                       "new_empty_strided", "zeros_like", "ones_like", "empty_like",
                       "full_like"})

_INDEX = "an index on the vocabulary dim (logits[..., i])"
_WRITE = "a write into the vocabulary dim (logits[..., i] = v)"


def _spans_vocab(t: Any) -> bool:
    """A non-derived operand that varies along the vocabulary (the last dim) when broadcast
    against the logits; an ``expand`` of one value (stride 0) does not."""
    return t.dim() > 0 and t.shape[-1] != 1 and t.stride(-1) != 0


def _spanning(operands: list[Any], derived: Callable[[Any], bool]) -> Any:
    return next((t for t in operands if not derived(t) and _spans_vocab(t)), None)


def _last(dim: int, ndim: int) -> bool:
    return ndim > 0 and dim % ndim == ndim - 1


def _indices_untouch_last(indices: list[Any], ndim: int) -> bool:
    """Whether ``aten.index``'s per-dim ``indices`` (None: a dim kept whole) leave the last
    dim whole; a bool mask over several dims flattens them, the vocabulary included."""
    import torch

    if any(i is not None and i.dtype in (torch.bool, torch.uint8) and i.dim() > 1
           for i in indices):
        return False
    return len(indices) < ndim or indices[ndim - 1] is None


def _bound(op: Any, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    bound: dict[str, Any] = {}
    for i, arg in enumerate(op._schema.arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _structural(op: Any, name: str, args: tuple, kwargs: Mapping[str, Any],
                derived: Callable[[Any], bool]) -> str | None:
    """The verdict on an op that moves entries rather than computing them (an index, a
    write at indices, a new dim); None for another op."""
    if name not in ("slice", "select", "unsqueeze", "index", "index_put", "index_put_"):
        return None
    a = _bound(op, args, kwargs)
    self = a["self"]
    ndim = self.dim()
    if name == "slice":
        dim, start, end, step = a["dim"], a["start"], a["end"], a["step"]
        whole = start in (None, 0) and (end is None or end >= self.shape[dim]) and step == 1
        return FOLLOW if not _last(dim, ndim) or whole else _INDEX
    if name == "select":
        return _INDEX if _last(a["dim"], ndim) else FOLLOW
    if name == "unsqueeze":
        return "a new dim after the vocabulary" if a["dim"] % (ndim + 1) == ndim else FOLLOW
    if not _indices_untouch_last(list(a["indices"]), ndim):
        return _INDEX if name == "index" else _WRITE
    if name == "index":
        return FOLLOW
    wide = _spanning([self, a["values"]], derived)
    return FOLLOW if wide is None else f"{_WRITE} with values of shape {tuple(wide.shape)}"


def judge(op: Any, args: tuple, kwargs: Mapping[str, Any],
          derived: Callable[[Any], bool]) -> str:
    """Whether ``op``, reading a tensor derived from the head's output, acts on each
    vocabulary entry on its own: FOLLOW its outputs, DROP them, or the refusal text."""
    name = op_name(op).removeprefix("aten.")
    if name in FACTORIES:
        return DROP  # a new tensor of the logits' metadata
    structural = _structural(op, name, args, kwargs, derived)
    if structural is not None:
        return structural
    if is_pointwise(op) or name in UNTAGGED_ELEMENTWISE:
        wide = _spanning(tensors((args, dict(kwargs))), derived)
        if wide is None:
            return FOLLOW
        return f"{op_name(op)} with an operand of shape {tuple(wide.shape)}"
    return op_name(op)


def output_head(model: Any) -> tuple[str | None, Any]:
    """``(FQN, module)`` of the model's output head (``get_output_embeddings``)."""
    get_head = getattr(model, "get_output_embeddings", None)
    try:
        head = get_head() if callable(get_head) else None
    except Exception:  # some heads are not reachable this way (NotImplementedError)
        head = None
    fqn = next((name for name, m in model.named_modules() if m is head), None) \
        if head is not None else None
    return fqn, head


def check_loss_parallel(model: Any, plan: Mapping[str, PlanEntry],
                        notes: list[str] | None = None, caller: Caller = GENERATE) -> str:
    """The vocab-sharded head's FQN; a PlanError when loss parallelism would not be exact.

    Refused: a model without an output head (``get_output_embeddings``), a head the plan
    does not leave vocab-sharded (not colwise, or replicated), a forward that does more than
    elementwise steps to the logits after the head. A forward the meta device cannot run
    leaves the post-processing unchecked: a note says so (``launch --check-parity`` shows).
    """
    fqn, head = output_head(model)
    if fqn is None:
        raise PlanError([error(
            f"{caller.check}.loss_parallel_no_head", caller.where or caller.flag,
            f"{caller.flag}: {type(model).__name__} has no output head "
            "(get_output_embeddings() is None): there are no vocabulary logits to keep "
            "sharded", hint=caller.hint)])
    entry = plan.get(fqn)
    if entry is None or not entry.is_vocab_sharded_head():
        named = (entry.params or EMPTY).get("weight") if entry is not None else None
        what = (f"its weight is {named.get(TP, REPLICATE)} on tp" if named is not None
                else f"the plan places no weight of this {type(head).__name__}")
        raise PlanError([error(
            f"{caller.check}.loss_parallel_head", caller.where or fqn,
            f"{caller.flag}: the output head {fqn} is not split on the vocabulary by the "
            f"plan ({what}; expected weight S(0) and output S(-1) on tp): only a colwise "
            "head has vocab-sharded logits to keep",
            hint=caller.hint + ", or shard the head colwise with a recipe rule")])
    _check_postprocess(model, fqn, head, notes, caller)
    return fqn


def check_declared(model: Any, plan: Mapping[str, PlanEntry],
                   caller: Caller = GENERATE) -> None:
    """Without loss parallelism, a PlanError when the plan still leaves the output head's
    logits vocab-sharded: the model would return one rank's slice as if it were all of them
    (and transformers' own loss would read it so)."""
    fqn, _ = output_head(model)
    entry = plan.get(fqn) if fqn is not None else None
    if entry is not None and entry.is_vocab_sharded_head():
        raise PlanError([error(
            f"{caller.check}.loss_parallel_undeclared", FLAG if caller.where else fqn,
            f"the plan leaves the output of the head {fqn} vocab-sharded (weight S(0), "
            "output S(-1) on tp) but loss_parallel is not set: the model would return one "
            "rank's slice of the logits as the logits",
            expected="out_dst R on tp for the head, or loss_parallel true (generate "
                     "--loss-parallel)")])


def model_findings(model: Any, plan: Plan, check: str, ours: bool) -> list[Finding]:
    """The rule for a built model and a frozen plan (verify's ``model`` check, the
    runtime's install): errors, and an info when the post-processing could not be checked;
    ``ours``: hpcodegen wrote the meta.

    Runs :func:`check_loss_parallel` when :func:`forward_needed`, :func:`check_declared`
    when the flag is not set and tp > 1 (with one rank the logits are whole). The forward
    may switch ``model`` to eager attention and stub its experts: pass a meta-device model
    nobody runs afterwards.
    """
    caller = meta_caller(check)
    notes: list[str] = []
    try:
        if not declared(plan) and plan.dims.size(TP) > 1:
            try:
                check_declared(model, plan.entries, caller)
            except PlanError as exc:
                if ours:
                    raise
                # a foreign meta: its own runtime may hand the head's output on as a DTensor
                # whose loss gathers it; ours returns the local slice, so say so, as the
                # flag's other foreign findings (plan_findings) do
                return [replace(f, severity=Severity.WARNING) for f in exc.findings]
        elif forward_needed(plan):
            check_loss_parallel(model, plan.entries, notes, caller)
    except PlanError as exc:
        return list(exc.findings)
    return [info(f"{check}.loss_parallel_unchecked", FLAG, note) for note in notes]


class _BodyOutput:
    """A decoder's output as the heads read it: ``last_hidden_state`` (also ``[0]``), and
    None for any other field (caches, router logits, attentions)."""

    def __init__(self, hidden: Any) -> None:
        self.last_hidden_state = hidden

    def __getattr__(self, name: str) -> Any:
        return None

    def __getitem__(self, index: int) -> Any:
        return (self.last_hidden_state,)[index]


def _forward(model: Any, body: Any = None, width: int = 0) -> Any:
    """One meta-device forward of ``model`` on ``(1, 4)`` token ids; with ``body`` (its
    decoder) answering zeros of ``width`` features, as ``last_hidden_state``."""
    import torch

    if body is not None:
        body.forward = lambda *_a, **_k: _BodyOutput(torch.zeros(1, 4, width, device="meta"))
    return forward(model, 1, 4, mask=True)


def _check_postprocess(model: Any, fqn: str, head: Any, notes: list[str] | None,
                       caller: Caller) -> None:
    """Watch what the forward does to the head's output. The decoder must run on meta first
    (its mask shortcuts read tensor values in some families, Inkling's): then it runs again
    with the decoder (``base_model``) answering zeros, as only the head's output matters."""
    from transformers.utils import logging as hf_logging

    taint = DerivedTensors(judge)
    handle = head.register_forward_hook(lambda _m, _a, out: taint.mark(out))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its notes on eager attention and slow kernels
    body = getattr(model, "base_model", None)
    weight = getattr(head, "weight", None)
    tries: list[tuple[Any, int]] = [(None, 0)]
    if body is not None and body is not model and weight is not None:
        tries.append((body, int(weight.shape[-1])))
    if getattr(model, "config", None) is not None:
        use_eager(model)  # transformers' mask shortcuts read values meta tensors lack
    output, failure = None, None
    try:
        for stub, width in tries:
            try:
                with taint.mode():
                    output = _forward(model, stub, width)
                break
            except Exception as exc:  # model code may not run on meta: try the next way
                if taint.violation is not None:
                    break  # it failed on the logits path: that step is the answer
                failure = exc
                taint.reset()
        else:
            if notes is not None:
                notes.append(f"{caller.flag}: what {type(model).__name__}.forward does to "
                             f"the logits after {fqn} could not be checked on the meta "
                             f"device ({type(failure).__name__}); launch --check-parity "
                             "verifies it")
            return
    finally:
        handle.remove()
        hf_logging.set_verbosity(verbosity)
    where = f"{type(model).__name__}.forward"
    if taint.violation is not None:
        raise PlanError([error(
            f"{caller.check}.loss_parallel_postprocess", caller.where or fqn,
            f"{caller.flag}: {where} applies {taint.violation} to the output of {fqn}, "
            "which is not elementwise per vocabulary entry; on each rank's slice of the "
            "vocabulary it would compute something else than on the full logits",
            hint=caller.hint)])
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    if not taint.is_derived(logits):
        raise PlanError([error(
            f"{caller.check}.loss_parallel_postprocess", caller.where or fqn,
            f"{caller.flag}: the logits {where} returns do not come from {fqn}",
            hint=caller.hint)])

