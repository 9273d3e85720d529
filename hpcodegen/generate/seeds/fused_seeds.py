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

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.seeds.fused_rank import rank_reads_alike
from hpcodegen.generate.seeds.fused_rows import Block, Watch, settle_slices
from hpcodegen.generate.seeds.module_facts import forward_source
from hpcodegen.generate.seeds.seeds import (
    CROSS_INPUTS,
    children,
    input_readers,
    io_features,
    is_linear,
)
from hpcodegen.generate.sources.hf_plan import Assignment
from hpcodegen.generate.sources.styles import Kind
from hpcodegen.tracer.dataflow import Flow
from hpcodegen.tracer.norms import is_norm

RULE = "<fused rows>"
#: the traced forward's batch and sequence (1 and a prime: no dim mistaken for heads)
BATCH, SEQ = 1, 11


def candidates(modules: Mapping[str, Any], taken: Collection[str], flow: Flow
               ) -> dict[str, Block]:
    """Blocks holding exactly two projections: one applied to the forward's input, the
    other called after it (in ``flow``, the model's traced forward) mapping back to that
    input's width; besides them only norms."""
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
        readers, order = input_readers(forward_source(module)), flow.child_order(fqn)
        for proj, last in (linears, linears[::-1]):
            if (proj in readers and last not in readers and proj in order and last in order
                    and order.index(proj) < order.index(last)
                    and io_features(kids[last])[1] == io_features(kids[proj])[0]):
                out[fqn] = Block(fqn, proj, last, norms)
    return out


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

        def post(m: Any, args: tuple, kwargs: dict, out: Any, w: Watch = w,
                 params: dict[str, Any] = own, n: list[int] = calls) -> None:
            if n[0] != 1:
                return
            got = {id(t) for t in tensors(out)}
            w.block.returned = sorted(k for k, p in params.items() if id(p) in got)
            proj = getattr(m, w.block.proj)
            settle_slices(w.block, io_features(proj)[1])
            if w.block.verdict[0] in ("blocks", "groups"):
                width = io_features(proj)[1] // w.block.verdict[1]
                w.block.rank_ok = rank_reads_alike(
                    m, w.block, divide_attrs(w.block, m, width), args, kwargs, out,
                    watches, io_features(proj)[1])

        def seed(_m: Any, _a: Any, out: Any, w: Watch = w, n: list[int] = calls) -> None:
            if n[0] == 1 and not w.state:
                w.seed(out)

        handles += [module.register_forward_pre_hook(pre, with_kwargs=True),
                    module.register_forward_hook(post, with_kwargs=True),
                    modules[f"{block.fqn}.{block.proj}"].register_forward_hook(seed)]
    return handles


def trace(model: Any, blocks: Mapping[str, Block]) -> str | None:
    """One forward of ``model`` on fake tensors deciding every block's verdict; the failure
    (the model cannot run on meta) or None."""
    from hpcodegen.tracer.dataflow import attention_kept
    from hpcodegen.tracer.hooks import removed
    from hpcodegen.tracer.model import forward, use_eager
    from hpcodegen.tracer.ops import is_pointwise, op_name, watch_ops

    modules = dict(model.named_modules())
    watches = [Watch(b) for b in blocks.values()]

    def observe(func: Any, args: tuple, kwargs: Mapping[str, Any], out: Any) -> None:
        name, pointwise = op_name(func)[len("aten."):], is_pointwise(func)
        for w in watches:
            if w.state:
                w.observe(name, pointwise, args, kwargs, out)

    try:  # eager: transformers' mask shortcuts read values meta tensors lack
        with attention_kept(model), removed(_hooks(modules, watches)):
            if getattr(model, "config", None) is not None:
                use_eager(model)
            forward(model, BATCH, SEQ, fake=True, watch=watch_ops(observe))
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

    def settle(self, model: Any, planned: Mapping[str, Assignment],
               seeds: Mapping[str, Assignment]) -> dict[str, Assignment]:
        """``seeds`` less those of a block this pass keeps whole where the other seeds
        would gather its projections while a region splits the same modeling class
        elsewhere (Falcon's ``FalconLinear`` in its MLP): one class has one generated
        forward, so that block stays whole (replicated). Blocks the other seeds do split
        are dropped from :attr:`kept`."""
        modules = dict(model.named_modules())
        every = {**planned, **seeds}
        own = lambda a: type(modules[a.fqn])  # noqa: E731
        region = {own(a) for a in every.values() if not a.param and a.fqn in modules
                  and a.kind in (Kind.COLWISE, Kind.ROWWISE)
                  and own(a).__module__.startswith("transformers.models.")}
        drop: set[str] = set()
        for fqn in list(self.kept):
            mine = [a for f, a in seeds.items() if f.startswith(f"{fqn}.") and not a.param]
            if any(own(a) in region for a in mine
                   if a.kind in (Kind.COLWISE_GATHER, Kind.ROWWISE_SPLIT)):
                drop |= {a.fqn for a in mine}
            elif mine:
                del self.kept[fqn]
        return {f: a for f, a in seeds.items() if f not in drop}

    def notes(self) -> list[str]:
        blocks = sorted(self.divide)
        out = []
        if blocks:
            out.append(f"fused projections: {len(blocks)} block(s) split by the row order "
                       f"their forward reads (hpcodegen/generate/seeds/fused_seeds.py), e.g. "
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
    from hpcodegen.generate.seeds.module_facts import first_arg

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


def divide_attrs(block: Block, module: Any, width: int) -> list[str]:
    """The attributes divided per rank: the head counts the forward reads (the lifter
    divides them too), and for blocks every head count and the ints sizing one block."""
    attrs = set(head_attrs(module))
    if block.verdict[0] == "blocks":
        source = forward_source(module)
        attrs |= set(head_attrs(module, read=False)) | {
            n for n, v in vars(module).items() if v == width and isinstance(v, int)
            and not isinstance(v, bool) and f"self.{n}" in source}
    return sorted(attrs)


def _styles(block: Block) -> dict[str, tuple]:
    """``child -> (kind, factor, style)``."""
    kind, count = block.verdict
    col = (Kind.COLWISE, count, f"packed_colwise:{count}") if kind == "blocks" else \
        (Kind.COLWISE, 1, "colwise")
    styles = {block.proj: col, block.out: (Kind.ROWWISE, 1, "rowwise")}
    styles.update({n: (Kind.REPLICATE_GRAD, 1, "replicated_with_grad_allreduce")
                   for n in block.norms})
    return styles


def fused_seeds(model: Any, taken: Collection[str], sp: bool, flow: Flow | None
                ) -> FusedSeeds:
    """Styles for every block with one fused input projection (module docstring) outside
    the modules ``taken`` (placed by other rules), the candidates' call order read from
    ``flow`` (the model's traced forward; none: no candidates). A block the trace leaves
    undecided (its projection output is not cut: an MLP) is not named.

    Raises:
        PlanError: with ``sp``, a block returning a parameter of its own untouched.
    """
    modules = dict(model.named_modules())
    blocks = candidates(modules, taken, flow) if flow is not None else {}
    found = FusedSeeds()
    if not blocks or trace(model, blocks) is not None:
        return found
    for fqn, block in blocks.items():
        if block.verdict[0] == "plain":
            continue  # its output is not cut: not a fused projection
        module, kids = modules[fqn], children(modules, fqn)
        why = why_whole(block, module, kids)
        if why is None and not block.rank_ok:
            continue  # a rank's copy reads its rows otherwise: the structural seeds' turn
        if why is not None:
            found.kept[fqn] = why
            continue
        for name, (kind, factor, style) in _styles(block).items():
            child = f"{fqn}.{name}"
            found.assignments[child] = Assignment(child, kind, factor, style, RULE)
        for name in block.returned:
            child = f"{fqn}.{name}"
            found.assignments[child] = Assignment(child, Kind.REPLICATE, 1, "replicate",
                                                  RULE, param=True)
            found.returned.append(child)
        found.divide[fqn] = divide_attrs(block, module, _width(block, kids[block.proj]))
    if sp and found.returned:
        raise PlanError([error(
            "generate.sp_returned_param", found.returned[0],
            f"{found.returned[0]}: with sequence parallelism (--sp) the parameter its module "
            "returns untouched is added by the caller to its rank's slice of the sequence, "
            "outside any boundary: its gradient would be partial over tp; run without --sp")])
    return found
