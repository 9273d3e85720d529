"""With ``--sp``: run the meta-device model once as the plan would shard its sequence.

Sequence parallelism hands every module between boundaries one rank's slice of the
sequence. Code outside the plan's modules may still size tensors by the full length it
reads elsewhere: GPT-2's ``hidden_states.view(input_ids.shape ...)``, an ALiBi bias built
from the attention mask, a learned position embedding the model adds itself. Nothing in
the plan shows it, so the generator runs the model on the meta device (torch's fake
tensors: shapes only, no data, no process group): once as it is, then with each
boundary's sequence transitions applied to the shapes (``S(1) -> R`` restores the full
length of dim 1, ``-> S(1)`` takes this rank's ``1/tp``), and refuses the plan when the
second run fails or its logits do not have the first run's shape, naming the first module
that went wrong.

Weights are whole on the meta model, so a split compute gives the shapes its gathered
result would: only the sequence dim needs emulating. A model whose plain meta run already
fails (data-dependent code) is not checked. The runs are the tracer's
(:func:`hpcodegen.tracer.model.forward`, fake tensors); the transitions bind to each
forward as the runtime binds them (:mod:`hpcodegen.binding`), and the parent of a
sequence-sharded embedding gets the runtime's default position ids
(:mod:`hpcodegen.sp_positions`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hpcodegen.binding import InputBinder, apply_outputs
from hpcodegen.errors import PlanError, error
from hpcodegen.placement import Shard
from hpcodegen.plan.entry import takes_token_ids
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import TP, PlanEntry
from hpcodegen.tracer.hooks import outputs_of, removed
from hpcodegen.tracer.model import forward

#: the sequence-sharded placements: ``(batch, seq, ...)`` activations and token rows
SEQ_DIMS = {Shard(1): 1, Shard(0): 0}


def _seq_fns(entry: PlanEntry, side: str, tp: int) -> dict[str, Callable[[Any], Any]]:
    """``{name: shape function}`` of the entry's sequence transitions on ``side``."""
    src = (entry.in_src if side == "in" else entry.out_src) or EMPTY
    dst = (entry.in_dst if side == "in" else entry.out_dst) or EMPTY
    fns: dict[str, Callable[[Any], Any]] = {}
    for name in set(src) | set(dst):
        s = SEQ_DIMS.get(src.get(name, EMPTY).get(TP))
        d = SEQ_DIMS.get(dst.get(name, EMPTY).get(TP))
        if s is not None and d != s:
            fns[name] = lambda x, dim=s: _resize(x, dim, x.shape[dim] * tp) \
                if _has_dim(x, dim) else x
        elif d is not None and s != d:
            fns[name] = lambda x, dim=d: _resize(x, dim, x.shape[dim] // tp) \
                if _has_dim(x, dim) else x
    return fns


def _has_dim(x: Any, dim: int) -> bool:
    import torch

    return isinstance(x, torch.Tensor) and x.dim() >= max(dim + 1, 2)


def _resize(x: Any, dim: int, length: int) -> Any:
    return x.new_empty((*x.shape[:dim], length, *x.shape[dim + 1:]))


def _shapes(out: Any) -> tuple:
    import torch

    return tuple(tuple(o.shape) if isinstance(o, torch.Tensor) else None
                 for o in outputs_of(out))


def _logits(out: Any) -> Any:
    return getattr(out, "logits", None) if not isinstance(out, tuple) else out[0]


def _run(model: Any, length: int) -> Any:
    """The model's logits on ``(2, length)`` token ids, shapes only: under torch's fake
    tensor mode, where transformers skips its data-dependent checks (packed sequences,
    all-ones masks) that a plain meta tensor cannot answer."""
    return _logits(forward(model, 2, length, fake=True))


def check_sp_shapes(model: Any, plan: Mapping[str, PlanEntry], tp: int,
                    classes: Mapping[str, str]) -> None:
    """Refuse ``plan`` (PlanError ``generate.sp_shapes``) when the model's forward does not
    run on sequence-sharded activations; see the module docstring."""
    modules = dict(model.named_modules())
    names = {id(m): fqn for fqn, m in modules.items()}
    length = 4 * tp
    reference: dict[str, tuple] = {}

    def record(mod: Any, _args: Any, out: Any) -> None:
        reference.setdefault(names[id(mod)], _shapes(out))

    try:
        with removed([m.register_forward_hook(record) for m in modules.values()]):
            ref_logits = _run(model, length)
    except Exception:  # data-dependent code cannot run on meta: nothing to check
        return
    if ref_logits is None:
        return

    stack: list[str] = []
    first_wrong: list[str] = []

    def enter(mod: Any, args: tuple, kw: dict) -> None:
        stack.append(names[id(mod)])

    def leave(mod: Any, _args: Any, out: Any) -> None:
        fqn = stack.pop() if stack else names[id(mod)]
        ref = reference.get(fqn)
        if first_wrong or ref is None:
            return
        if not _matches(_shapes(out), ref, tp):
            first_wrong.append(fqn)

    handles, wrapped = _shard_sequence(modules, plan, tp, classes)
    for m in modules.values():  # after the plan's hooks: they see the resized shapes
        handles.append(m.register_forward_pre_hook(enter, with_kwargs=True))
        handles.append(m.register_forward_hook(leave))
    try:
        with removed(handles):
            logits = _run(model, length)
        failure = None
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        logits = None
    finally:
        for parent in wrapped:
            parent.__dict__.pop("forward", None)
            parent.__dict__.pop("_hp_position_ids_wrapped", None)
    if failure is None and logits is not None and tuple(logits.shape) == tuple(ref_logits.shape):
        return
    where = stack[-1] if failure is not None and stack else (first_wrong or [""])[0]
    _refuse(where, modules.get(where, model), failure, logits, ref_logits)


def _shard_sequence(modules: Mapping[str, Any], entries: Mapping[str, PlanEntry],
                    tp: int, classes: Mapping[str, str]) -> tuple[list[Any], list[Any]]:
    """Hooks applying each boundary's sequence transitions to the shapes, bound as the
    runtime binds them, and the parents given the runtime's default position ids; returns
    ``(hook handles, wrapped parents)``."""
    from hpcodegen.sp_positions import install_default_position_ids

    handles: list[Any] = []
    wrapped: list[Any] = []
    for fqn, entry in entries.items():
        if not entry.boundary or fqn not in modules:
            continue
        module = modules[fqn]
        ins, outs = _seq_fns(entry, "in", tp), _seq_fns(entry, "out", tp)
        if ins:
            binder = InputBinder(module.forward, list(ins), fqn)
            handles.append(module.register_forward_pre_hook(
                lambda _m, a, kw, b=binder, f=ins: b.apply(a, kw, f), with_kwargs=True))
        if outs:
            order = list(entry.output_names) or ["output"]
            pos = [(order.index(n) if n in order else 0, fn) for n, fn in outs.items()]
            handles.append(module.register_forward_hook(
                lambda _m, _a, out, p=pos: apply_outputs(out, p)))
        if takes_token_ids(classes.get(fqn)) and entry.output_sequence_sharded() \
                and "." in fqn:
            parent = modules[fqn.rpartition(".")[0]]
            if "forward" not in parent.__dict__ and install_default_position_ids(parent):
                wrapped.append(parent)
    return handles, wrapped


def _refuse(where: str, module: Any, failure: str | None, logits: Any,
            ref_logits: Any) -> None:
    what = failure or (f"its logits come back with shape {tuple(logits.shape)} instead of "
                       f"{tuple(ref_logits.shape)}" if logits is not None else "no logits")
    raise PlanError([error(
        "generate.sp_shapes", where or "<root>",
        f"with sequence parallelism (--sp) {where or 'the model'} ({type(module).__name__}) "
        f"does not run on its rank's slice of the sequence: {what}; code outside the plan's "
        "boundaries sizes a tensor by the full sequence length (a reshape, a position bias "
        "or mask built by the model itself)",
        hint="generate without --sp")])


def _matches(got: tuple, ref: tuple, tp: int) -> bool:
    """An output has the unsharded shape, or it with this rank's slice of dim 1 (of dim 0
    for token rows)."""
    if len(got) != len(ref):
        return False
    for g, r in zip(got, ref, strict=True):
        if g is None or r is None or g == r:
            continue
        if len(g) != len(r) or len(g) < 2:
            return False
        seq = len(g) >= 2 and g[0] == r[0] and g[2:] == r[2:] and g[1] * tp == r[1]
        rows = len(g) == 2 and g[1] == r[1] and g[0] * tp == r[0]  # (tokens, features)
        if not (seq or rows):
            return False
    return True
