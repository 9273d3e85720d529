"""Which Linear feeds which, through pointwise ops only, in one meta-device forward.

Megatron's pair (a column-parallel Linear ``A``, then a row-parallel Linear ``B``) is exact
whatever sits between them as long as every step there acts entry by entry on ``A``'s
output: each rank then computes its own slice of ``B``'s input. Whether that holds is a
fact of the forward, not of the module tree (OPT's ``fc1``/``fc2`` are children of the
decoder layer, GIT's live in two modules), so it is read off one forward of the meta
model: every tensor a Linear returns is labelled with the Linear's FQN, every aten op
torch tags ``pointwise`` hands the union of its operands' labels to its outputs, and any
other op that reads a labelled tensor outside a Linear's own forward marks those labels
as *escaping* (the tensor is used whole: a reshape, a matmul, a softmax). The same run
records which modules were called, what each returned and whether a module was handed a
tensor for each of its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hpcodegen.tracer.hooks import argument_namer, outputs_of
from hpcodegen.tracer.ops import is_pointwise, op_name, tensors, watch_ops

#: aten ops linear in one tensor operand: a partial sum through them is still one
LINEAR_OPS = ("aten.mul", "aten.div", "aten.neg", "aten.clone", "aten._to_copy",
              "aten.alias", "aten.detach")


@dataclass
class Flow:
    """What one forward showed about the Linears of a model (FQNs throughout)."""

    #: every module whose forward ran
    called: set[str] = field(default_factory=set)
    #: Linear -> the Linears whose output reaches its input through pointwise ops only
    feeds: dict[str, frozenset[str]] = field(default_factory=dict)
    #: Linears whose output (or a pointwise result of it) some other op reads whole, or
    #: combines with a tensor that varies along its last dim and comes from no Linear
    escapes: set[str] = field(default_factory=set)
    #: module -> the Linear whose output the module returns first, unchanged or scaled
    #: (:data:`LINEAR_OPS`): nothing added to it, no residual
    returns: dict[str, str] = field(default_factory=dict)
    #: module -> the names of the arguments it was handed a tensor for
    tensor_args: dict[str, frozenset[str]] = field(default_factory=dict)
    #: watched module -> its first call: ``(args, kwargs)`` as :func:`spec_of` records
    #: them, and the shape of its first output
    calls: dict[str, tuple[Any, Any, tuple[int, ...]]] = field(default_factory=dict)
    #: module -> the first tensor it was handed (held: compared by identity)
    first_input: dict[str, Any] = field(default_factory=dict)
    #: the modules in the order their forwards were entered, each once
    order: list[str] = field(default_factory=list)
    #: module -> the first tensor its first call returned (held: compared by identity)
    first_output: dict[str, Any] = field(default_factory=dict)

    def child_order(self, fqn: str) -> list[str]:
        """The direct children of ``fqn`` (names under it) in the order their forwards
        were first entered: the order the block runs them, as the trace saw it."""
        prefix = f"{fqn}." if fqn else ""
        return [f[len(prefix):] for f in self.order
                if f.startswith(prefix) and f != fqn and "." not in f[len(prefix):]]

    def reads_output(self, reader: str, producer: str) -> bool:
        """Whether ``reader``'s first call was handed, first, the very tensor
        ``producer``'s first call returned (``self.q_norm(self.q_proj(x))``)."""
        given, made = self.first_input.get(reader), self.first_output.get(producer)
        return given is not None and given is made


#: a recorded tensor argument: rebuilt as an empty meta tensor of this shape and dtype
TENSOR = "tensor"


def spec_of(value: Any) -> Any:
    """What of an argument a replay needs: a tensor's shape and dtype (also inside a tuple
    or list, as rotary ``(cos, sin)``); anything else as it is."""
    import torch

    if isinstance(value, torch.Tensor):
        return (TENSOR, tuple(value.shape), value.dtype)
    if isinstance(value, dict):
        return {k: spec_of(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(spec_of(v) for v in value)
    return value


def rebuilt(spec: Any) -> Any:
    """The arguments a :func:`spec_of` describes, with empty meta tensors."""
    import torch

    if isinstance(spec, tuple) and len(spec) == 3 and spec[0] == TENSOR:
        return torch.zeros(spec[1], dtype=spec[2], device="meta")
    if isinstance(spec, dict):
        return {k: rebuilt(v) for k, v in spec.items()}
    if isinstance(spec, (tuple, list)):
        return type(spec)(rebuilt(s) for s in spec)
    return spec


class _Labels:
    """Tensor -> the Linears it derives from by pointwise ops (tensors held: no id reuse)."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self.held: dict[int, tuple[Any, frozenset[str]]] = {}
        self.inside = 0  # depth of Linear forwards running: their own ops are theirs
        #: id of a tensor a Linear returned, or a linear function of it alone -> the Linear
        self.made: dict[int, str] = {}

    def of(self, value: Any) -> frozenset[str]:
        found: frozenset[str] = frozenset()
        for t in tensors(value):
            found |= self.held.get(id(t), (None, frozenset()))[1]
        return found

    def set(self, value: Any, labels: frozenset[str]) -> None:
        for t in tensors(value):
            self.held[id(t)] = (t, labels)

    def observe(self, op: Any, args: tuple, kwargs: Mapping[str, Any], out: Any) -> None:
        """Hand labels on through a pointwise op; mark them escaping through any other."""
        if self.inside:
            return
        operands = tensors((args, dict(kwargs)))
        labels = self.of(operands)
        if not labels:
            return
        self.scale(op, args, out)
        if not is_pointwise(op):
            self.flow.escapes |= labels
            return
        width = max((t.shape[-1] for t in operands if t.dim()), default=1)
        if any(t.dim() and t.shape[-1] == width > 1 and not self.of(t) for t in operands):
            self.flow.escapes |= labels  # a full-width operand no rank holds a slice of
        self.set(out, labels)


    def scale(self, op: Any, args: tuple, out: Any) -> None:
        """Follow a Linear's output through the steps that are linear in it alone (a cast, a
        product or quotient by something not derived from it): a module returning that
        still returns a partial sum's worth, summed after it as well as before."""
        made = [self.made.get(id(t)) for t in tensors(args)]
        sources = {m for m in made if m is not None}
        name = op_name(op)
        if len(sources) != 1 or name not in LINEAR_OPS or (
                name in ("aten.mul", "aten.div") and made.count(None) != len(made) - 1) or (
                name == "aten.div" and made[0] is None):
            return
        self.made.update({id(t): sources.pop() for t in tensors(out)})


def _hooks(modules: Mapping[str, Any], labels: _Labels, is_linear: Callable[[Any], bool],
           watch: Callable[[str, Any], bool]) -> list[Any]:
    flow = labels.flow
    handles: list[Any] = []
    for fqn, module in modules.items():
        linear = is_linear(module)
        named = argument_namer(module)

        def pre(_m: Any, args: tuple, kwargs: dict, f: str = fqn, lin: bool = linear,
                name_of: Callable[..., dict[str, Any]] = named) -> None:
            if f not in flow.called:
                flow.order.append(f)
                given_tensors = tensors((args, kwargs))
                if given_tensors:
                    flow.first_input[f] = given_tensors[0]
            flow.called.add(f)
            given = {n for n, v in name_of(args, kwargs).items() if tensors(v)}
            flow.tensor_args[f] = flow.tensor_args.get(f, frozenset()) | given
            if f not in flow.calls and watch(f, _m):
                flow.calls[f] = (spec_of(args), spec_of(kwargs), ())
            if lin:
                flow.feeds[f] = flow.feeds.get(f, frozenset()) | labels.of(args)
                labels.inside += 1

        def post(_m: Any, _args: Any, output: Any, f: str = fqn, lin: bool = linear) -> None:
            first = outputs_of(output)[:1]
            if tensors(first) and f not in flow.first_output:
                flow.first_output[f] = tensors(first)[0]
            if lin:
                labels.inside -= 1
                labels.set(output, frozenset({f}))
                labels.made.update({id(t): f for t in first})
            if f in flow.calls and not flow.calls[f][2] and first:
                flow.calls[f] = (*flow.calls[f][:2], tuple(getattr(first[0], "shape", ())))
            source = labels.made.get(id(first[0])) if first else None
            if source is not None:
                flow.returns.setdefault(f, source)

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post))
    return handles


@contextmanager
def all_on_meta(model: Any) -> Iterator[None]:
    """Every parameter and buffer on the meta device for the duration of a block, then back:
    a constructor may leave one on the CPU (XLNet's ``mask_emb``, made by
    ``torch.FloatTensor``, which ignores the meta device), and one CPU tensor fails the run."""
    moved: list[tuple[Any, str, str, Any]] = []
    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, value in getattr(module, kind).items():
                if value is not None and value.device.type != "meta":
                    moved.append((module, kind, name, value))
    for module, kind, name, value in moved:
        meta = value.to("meta")
        getattr(module, kind)[name] = (type(value)(meta, value.requires_grad)
                                       if kind == "_parameters" else meta)
    try:
        yield
    finally:
        for module, kind, name, value in moved:
            getattr(module, kind)[name] = value


@contextmanager
def attention_kept(model: Any) -> Iterator[None]:
    """The attention implementation every config of ``model`` names, given back after a
    block that switches it (:func:`~hpcodegen.tracer.model.use_eager`): generate reads it
    later (``--cp`` picks its kernel by it)."""
    configs = {id(c): c for m in model.modules()
               if (c := getattr(m, "config", None)) is not None
               and hasattr(c, "_attn_implementation_internal")}
    kept = {k: c.__dict__.get("_attn_implementation_internal") for k, c in configs.items()}
    try:
        yield
    finally:
        for key, config in configs.items():
            config.__dict__["_attn_implementation_internal"] = kept[key]


def linear_flow(model: Any, is_linear: Callable[[Any], bool],
                watch: Callable[[str, Any], bool] = lambda _f, _m: False) -> Flow | None:
    """The :class:`Flow` of one eval-mode forward of the meta ``model`` on ``(2, 8)`` token
    ids (dropout off: it runs no op; eager attention), under torch's fake tensor mode,
    else on plain meta tensors; None when neither runs. ``watch(fqn, module)``: record
    that module's first call (``Flow.calls``). The model is given back as it was: its
    training flags and attention implementation."""
    from hpcodegen.tracer.model import use_eager

    training = {m: m.training for m in model.modules()}
    with attention_kept(model):
        if getattr(model, "config", None) is not None:
            use_eager(model)
        model.eval()
        try:
            for fake in (True, False):  # fake: transformers skips its value checks; meta
                flow = _traced(model, is_linear, watch, fake)  # by default: a model
                if flow is not None:                            # making tensors itself
                    return flow
            return None
        finally:
            for module, mode in training.items():
                module.training = mode


def _traced(model: Any, is_linear: Callable[[Any], bool], watch: Callable[[str, Any], bool],
            fake: bool) -> Flow | None:
    """One forward of :func:`linear_flow`, on fake tensors or on meta; None if it fails."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from hpcodegen.hf import no_cache_kwargs
    from hpcodegen.tracer.model import experts_shape_only, quiet_fake_tensors, token_ids

    where = FakeTensorMode(allow_non_fake_inputs=True) if fake else torch.device("meta")

    def run(watching: Any) -> None:
        with experts_shape_only(model), all_on_meta(model), quiet_fake_tensors(), where:
            ids = token_ids(2, 8)  # meta, as the weights: made inside the fake mode
            with watching:  # innermost: it sees each op before the fake mode runs it
                model(input_ids=ids, **no_cache_kwargs(model))

    try:
        return call_flow(model, run, is_linear, watch)
    except Exception:  # model code may not run on fake or meta tensors (XLNet's own CPU
        return None    # positions fail under fake)


def call_flow(module: Any, run: Callable[[Any], Any], is_linear: Callable[[Any], bool],
              watch: Callable[[str, Any], bool] = lambda _f, _m: False) -> Flow:
    """The :class:`Flow` of ``run(watching)``, a call of ``module`` made inside the dispatch
    mode ``watching`` (entered innermost, after any fake mode), its submodules hooked,
    without gradients; what ``run`` raises propagates. :func:`linear_flow` runs a whole
    model on meta token ids through it; a test runs a small module on CPU tensors."""
    import torch

    from hpcodegen.tracer.hooks import removed

    flow = Flow()
    labels = _Labels(flow)
    with removed(_hooks(dict(module.named_modules()), labels, is_linear, watch)), \
            torch.no_grad():
        run(watch_ops(labels.observe))
    return flow
