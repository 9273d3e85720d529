"""The row order of a fused input projection, read from what the forward does with its
output (lazy torch: one traced forward of the meta model).

A block whose forward reads its input with ONE projection and writes its output with
another (GPT-2's ``c_attn``/``c_proj``, a ``query_key_value``/``dense`` pair) packs
several tensors in the rows of the first. Its shapes cannot tell how; the forward can.
One forward on fake tensors is watched from each such projection's output on (aten ops,
after Python sugar: ``x[..., 0, :]`` is ``aten.select``), up to the first op that cuts it:

* cut on its last dim into ``k`` equal blocks (``split``, ``chunk``, slices tiling it):
  the rows are ``k`` blocks (q|k|v): ``packed_colwise:k`` gives each rank its share of
  every block; the ints the forward reads that size one block (``split_size``) and its
  head counts are divided per rank;
* first viewed as ``(..., G, r)`` (or ``(..., G, k, d)``), then cut inside each of the
  ``G`` groups: the rows are interleaved per head (or per key/value group): a plain
  ``colwise`` keeps each rank's groups whole (the lifter divides the head counts the
  forward reads, and refuses a ``G`` that tp does not divide);
* anything else (unequal blocks, a cut across the groups as multi-query attention's
  ``[..., :-2, :]``, an op that mixes the rows): the block stays whole, and says why.

Either split also needs every other input of the block to be per token: a tensor input
with a dim of the head count (an ALiBi bias built by the model for all heads) keeps the
block whole, as does a second key/value stream actually passed (a cross-attention). A
parameter the block returns untouched (a bias its caller adds after the reduction) is
replicated with its full gradient, and refused with ``--sp``, where its caller adds it
to one rank's slice of the sequence.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.hf_plan import Assignment
from hpcodegen.generate.module_facts import forward_source, is_norm
from hpcodegen.generate.seeds import (
    CROSS_INPUTS,
    call_order,
    children,
    input_readers,
    io_features,
    is_linear,
)
from hpcodegen.generate.styles import Kind

RULE = "<fused rows>"
#: the traced forward's batch and sequence (1 and a prime: no dim mistaken for heads)
BATCH, SEQ = 1, 11
#: ops that cut a tensor on one dim: ``name -> how its dim is read`` (see :func:`_cut_dim`)
CUTS = frozenset({"split", "split_with_sizes", "unbind", "select", "slice", "narrow",
                  "index", "chunk"})
#: ops that move values without touching the last dims' layout
KEEPS = frozenset({"clone", "_to_copy", "detach", "alias", "contiguous", "native_dropout",
                   "dropout", "lift_fresh"})


@dataclass
class Block:
    """A candidate: the block, its fused input projection and output projection."""

    fqn: str
    proj: str
    out: str
    norms: list[str]
    #: the verdict: ("blocks", k) | ("groups", G) | ("whole", why) | ("plain", "")
    verdict: tuple[str, Any] = ("plain", "")
    inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    returned: list[str] = field(default_factory=list)
    slices: list[tuple[int, int]] = field(default_factory=list)


def candidates(modules: Mapping[str, Any], taken: Collection[str]) -> dict[str, Block]:
    """Blocks holding exactly two projections: one applied to the forward's input, the
    other called after it mapping back to that input's width; besides them only norms."""
    out: dict[str, Block] = {}
    for fqn, module in modules.items():
        if not fqn or any(t == fqn or t.startswith(f"{fqn}.") or fqn.startswith(f"{t}.")
                          for t in taken):
            continue
        kids = children(modules, fqn)
        held = {n for n, m in kids.items() if any(True for _ in m.parameters())}
        linears = [n for n in held if is_linear(kids[n])]
        norms = sorted(n for n in held - set(linears) if is_norm(kids[n]))
        if len(linears) != 2 or held - set(linears) - set(norms):
            continue
        source = forward_source(module)
        readers, order = input_readers(source), call_order(source)
        for proj, last in (linears, linears[::-1]):
            if (proj in readers and last not in readers and proj in order and last in order
                    and order.index(proj) < order.index(last)
                    and io_features(kids[last])[1] == io_features(kids[proj])[0]):
                out[fqn] = Block(fqn, proj, last, norms)
    return out


def _cut_dim(name: str, args: tuple, kwargs: Mapping[str, Any], ndim: int) -> int:
    """The dim an op of :data:`CUTS` cuts, normalised (``index``: its first indexed dim)."""
    if name == "index":
        indices = args[1] if len(args) > 1 else kwargs.get("indices", [])
        dim = next((i for i, x in enumerate(indices) if x is not None), 0)
    elif name in ("split", "split_with_sizes", "chunk"):  # (x, size(s), dim)
        dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    else:  # select, slice, narrow, unbind: (x, dim, ...)
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    return dim % ndim


def _cut_sizes(name: str, args: tuple, x: Any, dim: int) -> list[int] | None:
    """The lengths an op cuts ``x`` into along ``dim`` (a slice: its one piece)."""
    n = x.shape[dim]
    if name == "split":
        size = args[1]
        return [min(size, n - i) for i in range(0, n, size)]
    if name == "split_with_sizes":
        return list(args[1])
    if name == "chunk":
        size = math.ceil(n / args[1])
        return [min(size, n - i) for i in range(0, n, size)]
    return None


class Watch:
    """The state of one block's fused output through the forward: which derived tensors
    are still flat (``(..., O)``) or viewed into groups (``gdim``: the group dim)."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.state: dict[int, tuple[Any, int | None]] = {}  # id -> (tensor, gdim)

    def seed(self, out: Any) -> None:
        self.state[id(out)] = (out, None)

    def observe(self, name: str, pointwise: bool, args: tuple, kwargs: Mapping[str, Any],
                out: Any) -> None:
        """Judge one op reading a followed tensor (the first such operand)."""
        if self.block.verdict[0] != "plain":
            return
        x = next((a for a in args if id(a) in self.state), None)
        if x is None:
            return
        gdim = self.state[id(x)][1]
        outs = out if isinstance(out, (tuple, list)) else [out]
        if not any(hasattr(o, "shape") for o in outs):
            return  # metadata (``prim.device``, a size): the rows untouched
        if pointwise or name in KEEPS:
            for o in outs:
                if getattr(o, "shape", None) == x.shape:
                    self.state[id(o)] = (o, gdim)
            return
        if name in ("view", "_unsafe_view", "reshape"):
            self._viewed(x, gdim, outs[0])
        elif name in CUTS:
            self._cut(name, args, kwargs, x, gdim)
        else:
            self.block.verdict = ("plain", "") if gdim is None else (
                "whole", f"its fused output, viewed per group, goes to {name}")
            self.state.clear()

    def _viewed(self, x: Any, gdim: int | None, o: Any) -> None:
        lead = x.dim() - 1 if gdim is None else gdim
        if tuple(o.shape[:lead]) == tuple(x.shape[:lead]):
            if gdim is None and o.dim() > x.dim():  # (..., O) -> (..., G, r...)
                self.state[id(o)] = (o, lead)
                return
            if gdim is not None and tuple(o.shape[lead:lead + 1]) == (x.shape[gdim],):
                self.state[id(o)] = (o, gdim)  # the groups kept
                return
        if gdim is None and o.shape[-1] == x.shape[-1]:
            self.state[id(o)] = (o, None)  # leading dims merged (Conv1D's 2-D matmul)
            return
        self._stop(f"its fused output is reshaped to {tuple(o.shape)} across its rows")

    def _cut(self, name: str, args: tuple, kwargs: Mapping[str, Any], x: Any,
             gdim: int | None) -> None:
        dim = _cut_dim(name, args, kwargs, x.dim())
        if gdim is not None:
            if dim > gdim:
                self.block.verdict = ("groups", x.shape[gdim])
            elif dim == gdim:
                self._stop(f"its forward cuts the {x.shape[gdim]} groups of its fused "
                           "output apart (they are not one kind each)")
            return
        if dim != x.dim() - 1:
            return  # a cut of the batch or the sequence: the rows untouched
        sizes = _cut_sizes(name, args, x, dim)
        if sizes is None and name == "slice":
            start, end = [*args[2:4], None, None][:2]  # (x, dim, start, end)
            n = x.shape[dim]
            self.block.slices.append((max(0, min(start or 0, n)), min(end or n, n)))
            return
        if sizes and len(sizes) > 1 and len(set(sizes)) == 1:
            self.block.verdict = ("blocks", len(sizes))
        else:
            self._stop(f"its forward cuts its fused output into blocks {sizes or name}")

    def _stop(self, why: str) -> None:
        self.block.verdict = ("whole", why)
        self.state.clear()


def settle_slices(block: Block, width: int) -> None:
    """Slices of the last dim decide at the end: equal pieces tiling the width are blocks."""
    if block.verdict[0] != "plain" or not block.slices:
        return
    pieces = sorted(set(block.slices))
    lengths = {e - s for s, e in pieces}
    tiled = pieces[0][0] == 0 and pieces[-1][1] == width and all(
        a[1] == b[0] for a, b in itertools.pairwise(pieces))
    if tiled and len(lengths) == 1 and len(pieces) > 1:
        block.verdict = ("blocks", len(pieces))
    else:
        block.verdict = ("whole", f"its forward slices its fused output into {pieces}")


def _hooks(modules: Mapping[str, Any], watches: list[Watch]) -> list[Any]:
    """Seed each block's fused output; record its inputs' shapes and the parameters of its
    own it returns (first call only)."""
    from hpcodegen.tracer.hooks import argument_namer
    from hpcodegen.tracer.ops import tensors

    handles = []
    for w in watches:
        block, module = w.block, modules[w.block.fqn]
        named = argument_namer(module)
        own = dict(module.named_parameters(recurse=False))
        calls = [0]

        def pre(_m: Any, args: tuple, kwargs: dict, b: Block = block,
                name_of: Any = named, n: list[int] = calls) -> None:
            n[0] += 1
            if n[0] == 1:
                b.inputs = {k: tuple(v.shape) for k, v in name_of(args, kwargs).items()
                            if len(tensors(v)) == 1 and tensors(v)[0] is v}

        def post(_m: Any, _a: Any, out: Any, b: Block = block,
                 params: dict[str, Any] = own, n: list[int] = calls) -> None:
            if n[0] == 1:
                got = {id(t) for t in tensors(out)}
                b.returned = sorted(k for k, p in params.items() if id(p) in got)

        def seed(_m: Any, _a: Any, out: Any, w: Watch = w, n: list[int] = calls) -> None:
            if n[0] == 1 and not w.state:
                w.seed(out)

        handles += [module.register_forward_pre_hook(pre, with_kwargs=True),
                    module.register_forward_hook(post),
                    modules[f"{block.fqn}.{block.proj}"].register_forward_hook(seed)]
    return handles


def trace(model: Any, blocks: Mapping[str, Block]) -> str | None:
    """One forward of ``model`` on fake tensors deciding every block's verdict; the failure
    (the model cannot run on meta) or None."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hpcodegen.tracer.hooks import removed
    from hpcodegen.tracer.model import forward, use_eager
    from hpcodegen.tracer.ops import is_pointwise, op_name

    modules = dict(model.named_modules())
    watches = [Watch(b) for b in blocks.values()]

    class Rows(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name, pointwise = op_name(func)[len("aten."):], is_pointwise(func)
            for w in watches:
                if w.state:
                    w.observe(name, pointwise, args, kwargs, out)
            return out

    use_eager(model)
    try:
        with removed(_hooks(modules, watches)):
            forward(model, BATCH, SEQ, fake=True, watch=Rows())
    except Exception as exc:  # model code that cannot run on meta: nothing is decided
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    for w in watches:
        settle_slices(w.block, io_features(modules[f"{w.block.fqn}.{w.block.proj}"])[1])
    return None


@dataclass
class FusedSeeds:
    """What the trace decided: styles per module, head counts to divide per block, blocks
    kept whole (-> why), parameters returned untouched (full gradient)."""

    assignments: dict[str, Assignment] = field(default_factory=dict)
    divide: dict[str, list[str]] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    returned: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        blocks = sorted(self.divide)
        out = []
        if blocks:
            out.append(f"fused projections: {len(blocks)} block(s) split by the row order "
                       f"their forward reads (hpcodegen/generate/fused_seeds.py), e.g. "
                       f"{blocks[0]}")
        if self.kept:
            fqn = sorted(self.kept)[0]
            out.append(f"fused projections: {len(self.kept)} block(s) kept whole, e.g. "
                       f"{fqn}: {self.kept[fqn]}")
        return out


def head_attrs(module: Any, read: bool = True) -> dict[str, int]:
    """Integer attributes that count heads (``num_heads``, ``n_head``, ``num_kv_heads``; not
    ``head_dim``/``head_size``); with ``read``, only those the forward reads."""
    source = forward_source(module)
    return {n: v for n, v in vars(module).items()
            if isinstance(v, int) and not isinstance(v, bool) and "head" in n
            and not re.search(r"dim|size|mask", n) and (not read or f"self.{n}" in source)}


def _width(block: Block, proj: Any) -> int:
    return io_features(proj)[1] // block.verdict[1]


def why_whole(block: Block, module: Any, kids: Mapping[str, Any]) -> str | None:
    """Why a block the trace read cannot be split by its rows, or None (module docstring)."""
    from hpcodegen.generate.module_facts import first_arg

    kind, value = block.verdict
    if kind == "whole":
        return value
    if any(block.inputs.get(n) for n in CROSS_INPUTS):
        return "it takes keys and values from a second input, whose gradient would stay partial"
    counts = {c for c in {*head_attrs(module).values(),
                          value if kind == "groups" else 0} if c > 1}
    first = first_arg(module)
    for name, shape in sorted(block.inputs.items()):
        if name != first and any(d in counts for d in shape[:-1]):
            return (f"its input {name} {list(shape)} holds one entry per head, built for "
                    "all heads outside it")
    own = {n for n, _ in module.named_parameters(recurse=False)} - set(block.returned)
    if own:
        return f"it computes with parameters of its own ({', '.join(sorted(own))})"
    width = _width(block, kids[block.proj])
    for n in block.norms:
        if width % kids[n].weight.numel():
            return f"its norm {n} spans more than one group of the fused rows"
    return None


def _styles(block: Block, module: Any, width: int) -> tuple[dict[str, tuple], list[str]]:
    """``child -> (kind, factor, style)`` and the attributes to divide per rank."""
    kind, count = block.verdict
    attrs = set(head_attrs(module))
    if kind == "blocks":  # the module's head counts and the ints sizing one block
        source = forward_source(module)
        attrs |= set(head_attrs(module, read=False)) | {n for n, v in vars(module).items() if v == width and
                  isinstance(v, int) and not isinstance(v, bool) and f"self.{n}" in source}
        col = (Kind.COLWISE, count, f"packed_colwise:{count}")
    else:
        col = (Kind.COLWISE, 1, "colwise")
    styles = {block.proj: col, block.out: (Kind.ROWWISE, 1, "rowwise")}
    styles.update({n: (Kind.REPLICATE_GRAD, 1, "replicated_with_grad_allreduce")
                   for n in block.norms})
    return styles, sorted(attrs)


def fused_seeds(model: Any, taken: Collection[str], sp: bool) -> FusedSeeds:
    """Styles for every block with one fused input projection (module docstring) outside
    the modules ``taken`` (placed by other rules). A block the trace leaves undecided (its
    projection output is not cut: an MLP) is not named.

    Raises:
        PlanError: with ``sp``, a block returning a parameter of its own untouched.
    """
    modules = dict(model.named_modules())
    blocks = candidates(modules, taken)
    found = FusedSeeds()
    if not blocks or trace(model, blocks) is not None:
        return found
    for fqn, block in blocks.items():
        if block.verdict[0] == "plain":
            continue
        module, kids = modules[fqn], children(modules, fqn)
        why = why_whole(block, module, kids)
        if why is not None:
            found.kept[fqn] = why
            continue
        styles, attrs = _styles(block, module, _width(block, kids[block.proj]))
        for name, (kind, factor, style) in styles.items():
            child = f"{fqn}.{name}"
            found.assignments[child] = Assignment(child, kind, factor, style, RULE)
        for name in block.returned:
            child = f"{fqn}.{name}"
            found.assignments[child] = Assignment(child, Kind.REPLICATE, 1, "replicate",
                                                  RULE, param=True)
            found.returned.append(child)
        found.divide[fqn] = attrs
    if sp and found.returned:
        raise PlanError([error(
            "generate.sp_returned_param", found.returned[0],
            f"{found.returned[0]}: with sequence parallelism (--sp) the parameter its module "
            "returns untouched is added by the caller to its rank's slice of the sequence, "
            "outside any boundary: its gradient would be partial over tp; run without --sp")])
    return found
