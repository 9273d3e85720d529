"""Reading a fused projection's row order from the aten ops its output goes through.

:class:`Watch` follows one block's fused output through a traced forward (see
:mod:`hpcodegen.generate.seeds.fused_seeds`, which runs the trace and turns the verdict into
styles): pointwise ops keep the layout; a view splitting the last dim into ``(G, ...)``
makes it grouped; the first cut decides. The verdicts: ``("blocks", k)`` (equal blocks on
the last dim), ``("groups", G)`` (cut inside each of ``G`` groups), ``("whole", why)``,
``("plain", "")`` (no cut seen: not a fused projection).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: ops that cut a tensor on one dim (see :func:`_cut_dim`)
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
    #: per group, the shape inside it (``groups``): a rank's copy must keep it
    inner: tuple[int, ...] = ()
    #: whether a rank's copy of the block (:mod:`hpcodegen.generate.seeds.fused_rank`) ran and
    #: read its share of the rows the same way
    rank_ok: bool = False



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
                self.block.inner = tuple(x.shape[gdim + 1:])
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
