"""A rank's copy of a fused block, run on the traced inputs: does the forward read its
share of the rows as the whole block reads all of them? (lazy torch)

The ops a forward applies to its fused output say how the rows are ordered, but not
whether the forward still reads them so once each rank holds ``1/tp`` of them: a forward
that sizes its view from a constant (CodeGen's ``mp_num = 4`` blocks) rather than from
the head counts the plan divides would view a rank's rows into the wrong groups. So the
block is copied as one rank would hold it at tp :data:`TP` (the fused projection's output
rows and the output projection's input columns cut to ``1/tp``, the head counts and block
sizes the plan divides divided), run on the same inputs, and its fused output watched
again: it must run, return the whole block's output shape, and cut ``k`` blocks again, or
``G/tp`` groups of the same shape.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from typing import Any

from hpcodegen.generate.seeds.fused_rows import Block, Watch, settle_slices

#: the tp a rank's copy is made for
TP = 2


def _bare(module: Any) -> Any:
    """A shallow copy of ``module`` with its own parameter, child and (empty) hook dicts."""
    c = copy.copy(module)
    for key, value in vars(module).items():
        if "hooks" in key and hasattr(value, "clear"):  # hooks of the original stay its own
            c.__dict__[key] = type(value)()
    c.__dict__["_parameters"] = dict(module._parameters)
    c.__dict__["_modules"] = dict(module._modules)
    return c


def _narrowed(proj: Any, rows: bool) -> Any:
    """``proj`` (a Linear or a Conv1D) with ``1/TP`` of its output rows (``rows``) or of
    its input columns."""
    c = _bare(proj)
    w, b = proj._parameters["weight"], proj._parameters.get("bias")
    conv = not hasattr(proj, "in_features")  # Conv1D: weight (in, out)
    out_dim = 1 if conv else 0
    dim = out_dim if rows else 1 - out_dim
    c._parameters["weight"] = w.narrow(dim, 0, w.shape[dim] // TP)
    if rows and b is not None:
        c._parameters["bias"] = b.narrow(0, 0, b.shape[0] // TP)
    name = ("nf" if conv else "out_features") if rows else ("nx" if conv else "in_features")
    if isinstance(getattr(proj, name, None), int):
        c.__dict__[name] = getattr(proj, name) // TP
    return c


def rank_copy(module: Any, block: Block, attrs: Collection[str]) -> Any:
    """``module`` as one rank holds it (module docstring)."""
    c = _bare(module)
    c._modules[block.proj] = _narrowed(module._modules[block.proj], rows=True)
    c._modules[block.out] = _narrowed(module._modules[block.out], rows=False)
    for name in attrs:
        if isinstance(getattr(module, name, None), int):
            c.__dict__[name] = getattr(module, name) // TP
    return c


def _first(value: Any) -> Any:
    from hpcodegen.tracer.hooks import outputs_of

    outs = outputs_of(value)
    return tuple(outs[0].shape) if outs and hasattr(outs[0], "shape") else None


def rank_reads_alike(module: Any, block: Block, attrs: Collection[str], args: tuple,
                     kwargs: Mapping[str, Any], output: Any, watches: list[Watch],
                     width: int) -> bool:
    """Run the rank's copy on the traced ``args``/``kwargs`` (inside the trace: its ops
    reach ``watches``) and compare (module docstring)."""
    twin = Block(block.fqn, block.proj, block.out, block.norms)
    watch = Watch(twin)
    sim = rank_copy(module, block, attrs)
    handle = sim._modules[block.proj].register_forward_hook(lambda _m, _a, o: watch.seed(o))
    watches.append(watch)
    try:
        got = sim(*args, **kwargs)
    except Exception:  # the rank's copy cannot run: the rows are not read per group
        return False
    finally:
        watches.remove(watch)
        handle.remove()
    settle_slices(twin, width // TP)
    kind, count = block.verdict
    if _first(got) != _first(output):
        return False
    if kind == "groups":
        return twin.verdict == ("groups", count // TP) and twin.inner == block.inner
    return twin.verdict == block.verdict
