"""Loss parallelism: when a head's logits may stay vocab-sharded, exactly (one rule).

With loss parallelism (``parallel_dims.loss_parallel``) the output head's logits stay as
each rank's slice of the vocabulary, and the model's forward runs on that slice whatever it
does to the logits after the head. That is exact only when every step is elementwise per
vocabulary entry (Gemma-2's soft-capping ``tanh(x / c) * c``, Cohere's ``logit_scale``,
Granite's ``logits_scaling``, a dtype cast). A step that reads the vocabulary as a whole (a
softmax, a slice to ``unpadded_vocab_size``, a full-vocab bias, writing global token ids as
in Chameleon's ``logits[:, :, image_tokens] = min``) would compute something else on a
slice, silently.

So the plan must leave the head's output ``S(-1)`` (a colwise head; a rowwise head already
reduces its output, there is nothing to keep sharded), and one forward of the meta model is
watched from the head's output onwards (:class:`_VocabTaint`): every torch call that takes a
tensor derived from the head output must be one of a short list of elementwise operations
whose other tensor operands do not span the vocabulary, and the ``logits`` the model
returns must derive from the head.

The one rule, run by three callers with their own code prefix (``generate.``, ``model.``,
``runtime.``), so that a hand-edited or foreign meta cannot bypass what ``generate
--loss-parallel`` refuses:

* :func:`plan_findings` (pure, the ``plan`` check, hence also the runtime's install-time
  checks): the flag needs a tp axis of size > 1 and a boundary that leaves its output
  vocab-sharded;
* :func:`check_loss_parallel` (a built model): ``generate --loss-parallel``;
* :func:`model_findings` (a built model and a meta): verify's ``model`` check and
  ``parallelize_from_generated``. It also refuses the converse, a head whose output the
  plan leaves vocab-sharded without the flag: the model would return a slice of the logits
  as if it were all of them.

torch and transformers are imported inside the functions that take a model only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from hpcodegen.errors import Finding, PlanError, Severity, error, info, pointer, warning
from hpcodegen.plan.entry import (
    axis_sizes,
    is_vocab_sharded_head,
    param_plan,
    vocab_sharded_heads,
)

#: Where findings about the flag point: ``/parallel_dims/loss_parallel``
FLAG = pointer("parallel_dims", "loss_parallel")

#: Tensor methods / torch functions that act on each vocabulary entry on its own
_ELEMENTWISE = frozenset({
    # casts, copies, layout
    "float", "double", "half", "bfloat16", "to", "type", "type_as", "contiguous", "clone",
    "detach", "detach_", "requires_grad_", "cpu", "cuda",
    # arithmetic (the other operand is checked not to span the vocabulary)
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__",
    "__rmul__", "__imul__", "__truediv__", "__rtruediv__", "__itruediv__", "__div__",
    "__neg__", "__pos__", "__pow__", "__rpow__", "add", "add_", "sub", "sub_", "mul", "mul_",
    "div", "div_", "true_divide", "neg", "pow", "square",
    # pointwise functions
    "tanh", "tanh_", "sigmoid", "clamp", "clamp_", "clip", "clip_", "exp", "log", "abs",
    "nan_to_num", "nan_to_num_", "masked_fill", "masked_fill_", "where",
    # comparisons and tests, per entry
    "__gt__", "__lt__", "__ge__", "__le__", "__eq__", "__ne__", "gt", "lt", "ge", "le", "eq",
    "ne", "isnan", "isinf", "isfinite", "logical_not", "__invert__",
})


#: calls that only read the logits' shape, dtype and device to make a new tensor
_FACTORIES = frozenset({"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor",
                        "zeros_like", "ones_like", "empty_like", "full_like"})


def _tensors(value: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_flatten

    return [x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor)]


def _is_whole(item: Any) -> bool:
    return isinstance(item, slice) and item == slice(None)


def _last_dim_untouched(index: Any, ndim: int) -> bool:
    """Whether ``x[index]`` keeps the last dim of an ``ndim``-dim tensor whole and last."""
    import torch

    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 1
           for i in items):
        return False  # a mask over several dims flattens them, the vocabulary included
    if any(i is Ellipsis for i in items):
        trailing = items[[i is Ellipsis for i in items].index(True) + 1:]
        addressed = [i for i in trailing if i is not None]
        return not addressed or _is_whole(addressed[-1])
    addressed = [i for i in items if i is not None]
    return len(addressed) < ndim or _is_whole(addressed[-1])


def _spans_vocab(t: Any) -> bool:
    """A non-derived operand broadcast against the logits along the vocabulary."""
    return t.dim() > 0 and t.shape[-1] != 1


#: how a refused call is named in the error
_DESCRIBE = {"__getitem__": "an index on the vocabulary dim (logits[..., i])",
             "__setitem__": "a write into the vocabulary dim (logits[..., i] = v)"}


def _caller() -> str:
    """``file:line`` of the model code that made the current torch call."""
    import sys

    frame = sys._getframe(1)
    skip = (__file__, "/torch/")
    while frame is not None and any(part in frame.f_code.co_filename for part in skip):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    marker = "/transformers/"
    short = path[path.index(marker) + 1:] if marker in path else path
    return f"{short}:{frame.f_lineno}"


class _VocabTaint:
    """Tracks tensors derived from the head output through one forward; records the first
    torch call on them that is not elementwise per vocabulary entry (and where it is)."""

    def __init__(self) -> None:
        self.derived: dict[int, Any] = {}
        self.violation: str | None = None

    def reset(self) -> None:
        self.derived.clear()
        self.violation = None

    def mark(self, value: Any) -> None:
        for t in _tensors(value):
            self.derived[id(t)] = t

    def is_derived(self, value: Any) -> bool:
        return any(id(t) in self.derived for t in _tensors(value))

    def mode(self) -> Any:
        from torch.overrides import TorchFunctionMode

        taint = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                try:
                    out = func(*args, **kwargs)
                except Exception:  # a call on the logits the meta device cannot run
                    if taint.violation is None and taint.is_derived((args, kwargs)):
                        taint.refuse(func, "reads values")
                    raise
                taint.observe(func, args, kwargs, out)
                return out

        return Mode()

    def refuse(self, func: Any, detail: str = "") -> None:
        name = getattr(func, "__name__", repr(func))
        text = _DESCRIBE.get(name, name) + (f" {detail}" if detail else "")
        self.violation = f"{text} (at {_caller()})"

    def observe(self, func: Any, args: tuple, kwargs: Mapping[str, Any], out: Any) -> None:
        operands = _tensors((args, dict(kwargs)))
        inputs = [t for t in operands if id(t) in self.derived]
        name = getattr(func, "__name__", "")
        if not inputs or self.violation is not None:
            return  # not on the logits path
        if (name != "__setitem__" and not _tensors(out)) or name in _FACTORIES:
            return  # metadata (shape, dtype, device), or a new tensor of that metadata
        ndim = inputs[0].dim()
        detail = ""
        if name == "__getitem__":  # index tensors address the leading dims
            ok = _last_dim_untouched(args[1], ndim)
        elif name == "__setitem__":  # a constant or derived values, not per token id
            value = _tensors(args[2] if len(args) > 2 else None)
            ok = _last_dim_untouched(args[1], ndim) and not any(
                id(t) not in self.derived and _spans_vocab(t) for t in value)
        elif name in _ELEMENTWISE:
            spanning = [t for t in operands if id(t) not in self.derived and _spans_vocab(t)]
            ok = not spanning
            if spanning:
                detail = f"with an operand of shape {tuple(spanning[0].shape)}"
        else:
            ok = False
        if not ok:
            self.refuse(func, detail)
            return
        self.mark(out)


def _output_logits(output: Any) -> Any:
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    return logits


@dataclass(frozen=True)
class Caller:
    """Who applies the rule: its code prefix, how it names the flag, where its findings
    point (None: at the head's FQN) and what it suggests."""

    check: str
    flag: str
    where: str | None
    hint: str


#: ``generate --loss-parallel``
GENERATE = Caller("generate", "--loss-parallel", None, "generate without --loss-parallel")


def meta_caller(check: str) -> Caller:
    """verify's ``model`` check and the runtime: the flag is the meta's."""
    return Caller(check, "parallel_dims.loss_parallel", FLAG,
                  "regenerate the artifact without --loss-parallel (loss_parallel false)")


def declared(meta: Mapping[str, Any]) -> bool:
    """``parallel_dims.loss_parallel`` is true."""
    dims = meta.get("parallel_dims")
    return isinstance(dims, Mapping) and dims.get("loss_parallel") is True


def plan_findings(meta: Mapping[str, Any], check: str) -> list[Finding]:
    """The flag on a plan that keeps nothing vocab-sharded (pure: no model needed).

    ``loss_parallel`` needs a tp axis of size > 1 and a boundary whose weight is ``S(0)``
    and whose output stays ``S(-1)`` on tp (:func:`hpcodegen.plan.entry.vocab_sharded_heads`).
    Otherwise the logits are whole and the flag misleads whoever computes the loss from it:
    an error in a meta hpcodegen wrote, a warning in a foreign one (the existing system
    writes the flag from its job config whatever the mesh; its plan still runs exactly).
    """
    from hpcodegen.artifact.digest import is_hpcodegen_meta

    if not declared(meta):
        return []
    make = error if is_hpcodegen_meta(meta) else warning
    tp = axis_sizes(meta).get("tp", 1)
    if tp <= 1:
        return [make(f"{check}.loss_parallel_without_tp", FLAG,
                     f"loss_parallel is true but tp_size is {tp}: the logits are not split "
                     "over any axis, there is no vocab-sharded output to keep",
                     expected="tp_size > 1, or loss_parallel false",
                     hint="generate --loss-parallel only with --tp > 1")]
    if param_plan(meta) and not vocab_sharded_heads(meta):  # (an empty plan: plan.empty)
        return [make(f"{check}.loss_parallel_no_sharded_head", FLAG,
                     "loss_parallel is true but no boundary of param_plan leaves its output "
                     "vocab-sharded (weight S(0) and output S(-1) on tp, as a colwise "
                     "lm_head): the logits are gathered whole, so a loss-parallel cross "
                     "entropy would read the full vocabulary as one rank's slice",
                     expected="an output head with weight S(0) and out_dst S(-1) on tp, or "
                              "loss_parallel false")]
    return []


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


def check_loss_parallel(model: Any, plan: Mapping[str, Mapping[str, Any]],
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
    if not (isinstance(entry, Mapping) and is_vocab_sharded_head(entry)):
        params = entry.get("params") if isinstance(entry, Mapping) else None
        named = params.get("weight") if isinstance(params, Mapping) else None
        what = (f"its weight is {named.get('tp', 'R')} on tp" if isinstance(named, Mapping)
                else f"the plan places no weight of this {type(head).__name__}")
        raise PlanError([error(
            f"{caller.check}.loss_parallel_head", caller.where or fqn,
            f"{caller.flag}: the output head {fqn} is not split on the vocabulary by the "
            f"plan ({what}; expected weight S(0) and output S(-1) on tp): only a colwise "
            "head has vocab-sharded logits to keep",
            hint=caller.hint + ", or shard the head colwise with a recipe rule")])
    _check_postprocess(model, fqn, head, notes, caller)
    return fqn


def check_declared(model: Any, plan: Mapping[str, Mapping[str, Any]],
                   caller: Caller = GENERATE) -> None:
    """Without loss parallelism, a PlanError when the plan still leaves the output head's
    logits vocab-sharded: the model would return one rank's slice as if it were all of them
    (and transformers' own loss would read it so)."""
    fqn, _ = output_head(model)
    entry = plan.get(fqn) if fqn is not None else None
    if isinstance(entry, Mapping) and is_vocab_sharded_head(entry):
        raise PlanError([error(
            f"{caller.check}.loss_parallel_undeclared", FLAG if caller.where else fqn,
            f"the plan leaves the output of the head {fqn} vocab-sharded (weight S(0), "
            "output S(-1) on tp) but loss_parallel is not set: the model would return one "
            "rank's slice of the logits as the logits",
            expected="out_dst R on tp for the head, or loss_parallel true (generate "
                     "--loss-parallel)")])


def forward_needed(meta: Mapping[str, Any]) -> bool:
    """:func:`model_findings` runs a forward: the flag is set, tp > 1 and the plan keeps an
    output vocab-sharded (else :func:`plan_findings` has said what is wrong)."""
    return declared(meta) and axis_sizes(meta).get("tp", 1) > 1 \
        and bool(vocab_sharded_heads(meta))


def model_findings(model: Any, meta: Mapping[str, Any], check: str) -> list[Finding]:
    """The rule for a built model and a frozen meta (verify's ``model`` check, the
    runtime's install): errors, and an info when the post-processing could not be checked.

    Runs :func:`check_loss_parallel` when :func:`forward_needed`, :func:`check_declared`
    when the flag is not set and tp > 1 (with one rank the logits are whole). The forward
    may switch ``model`` to eager attention and stub its experts: pass a meta-device model
    nobody runs afterwards.
    """
    from hpcodegen.artifact.digest import is_hpcodegen_meta

    caller = meta_caller(check)
    plan = param_plan(meta)
    notes: list[str] = []
    try:
        if not declared(meta) and axis_sizes(meta).get("tp", 1) > 1:
            try:
                check_declared(model, plan, caller)
            except PlanError as exc:
                if is_hpcodegen_meta(meta):
                    raise
                # a foreign meta: its own runtime may hand the head's output on as a DTensor
                # whose loss gathers it; ours returns the local slice, so say so, as the
                # flag's other foreign findings (plan_findings) do
                return [replace(f, severity=Severity.WARNING) for f in exc.findings]
        elif forward_needed(meta):
            check_loss_parallel(model, plan, notes, caller)
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

    from hpcodegen.hf import no_cache_kwargs

    ids = torch.zeros(1, 4, dtype=torch.long, device="meta")
    if body is not None:
        body.forward = lambda *_a, **_k: _BodyOutput(torch.zeros(1, 4, width, device="meta"))
    return model(input_ids=ids, attention_mask=torch.ones_like(ids), **no_cache_kwargs(model))


def _check_postprocess(model: Any, fqn: str, head: Any, notes: list[str] | None,
                       caller: Caller) -> None:
    """Watch what the forward does to the head's output. The decoder must run on meta first
    (its mask shortcuts read tensor values in some families, Inkling's): then it runs again
    with the decoder (``base_model``) answering zeros, as only the head's output matters."""
    import torch
    from transformers.utils import logging as hf_logging

    from hpcodegen.inspect.trace import _stub_experts, _use_eager

    taint = _VocabTaint()
    handle = head.register_forward_hook(lambda _m, _a, out: taint.mark(out))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its notes on eager attention and slow kernels
    body = getattr(model, "base_model", None)
    weight = getattr(head, "weight", None)
    tries: list[tuple[Any, int]] = [(None, 0)]
    if body is not None and body is not model and weight is not None:
        tries.append((body, int(weight.shape[-1])))
    if getattr(model, "config", None) is not None:
        _use_eager(model)  # transformers' mask shortcuts read values meta tensors lack
    _stub_experts(model)
    output, failure = None, None
    try:
        for stub, width in tries:
            try:
                with torch.no_grad(), taint.mode():
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
    if not taint.is_derived(_output_logits(output)):
        raise PlanError([error(
            f"{caller.check}.loss_parallel_postprocess", caller.where or fqn,
            f"{caller.flag}: the logits {where} returns do not come from {fqn}",
            hint=caller.hint)])

