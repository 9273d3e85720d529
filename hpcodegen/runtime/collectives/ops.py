"""The four lowered collectives on one local tensor: all_gather, all_reduce, reduce_scatter
and the local chunk.

Two executions of the same ops, chosen per call:

* **Eager** (the hot path): the ``ProcessGroup`` methods themselves (``allreduce``,
  ``all_gather_single``, ``reduce_scatter_single``) into a result buffer we allocate, then
  ``wait()``. ``torch.distributed.all_reduce`` and friends reach the same methods after
  7-13 us of Python checks per call on a no-op group (argument checks, a fresh options
  object, the coalescing lookup, the exception-logging wrapper); the functional collectives
  cost 26-40 us (autograd wrapper, ``AsyncCollectiveTensor``). ``CommDebugMode`` counts the
  c10d ops the methods dispatch (``allreduce_``, ``_allgather_base_``,
  ``_reduce_scatter_base_``), forward and backward alike. The input is never written: an
  all_reduce reduces a fresh copy, so tensors that autograd saved or the caller still holds
  (a residual, a gradient shared by two branches) keep their values.
* **Under ``torch.compile``** (``torch.compiler.is_compiling()``): the functional
  collectives of ``torch.distributed._functional_collectives``, which dynamo traces into
  the graph (no graph break) and inductor schedules.

Two of them carry their own autograd (no Python ``autograd.Function``): :func:`reduce`
(a ``clone``, identity backward) and :func:`gather` (a ``cat``, local-chunk backward).

Measured on torch 2.13: gloo runs ``all_gather_single`` (concatenated output form only, not
the stacked one) and ``reduce_scatter_single``, so no all_reduce + chunk emulation is
needed; a reduce_scatter whose dim does not divide by the group size still falls back to
all_reduce + chunk.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol

from hpcodegen.errors import PlanError, error
from hpcodegen.runtime.collectives.comm import Comm, as_comm
from hpcodegen.runtime.collectives.local import LocalFn, compiling


def gather(x: torch.Tensor, dim: int, group: Any, world: int | None = None) -> torch.Tensor:
    """all_gather of equal local shards, concatenated on ``dim`` (negative allowed).

    Differentiable as DTensor's ``Shard(dim) -> Replicate``: the backward is this rank's chunk
    of the gradient (``cat`` puts ``x`` itself in this rank's slot), no Python autograd.
    """
    comm = as_comm(group)
    src = x.detach().contiguous()
    if compiling():
        group_, n, rank = comm.traced()
        out = funcol.all_gather_tensor(src, 0, group_)
    else:
        pg = comm.resolve()
        n, rank = comm.size, comm.rank
        out = src.new_empty((n * src.shape[0], *src.shape[1:]))
        pg.all_gather_single(out, src, comm.gather_opts).wait()
    return place_gathered(x, out, dim, n, rank)


def place_gathered(x: torch.Tensor, out: torch.Tensor, dim: int, n: int,
                   rank: int) -> torch.Tensor:
    """The all_gather result ``out`` (shards stacked on dim 0) laid out on ``dim``; when a
    gradient flows, ``x`` itself in this rank's slot (``cat``'s backward is the chunk)."""
    d = dim % x.dim()
    if n == 1:
        return x
    if not (x.requires_grad and torch.is_grad_enabled()):
        return out if d == 0 else torch.cat(out.chunk(n), d)
    parts = list(out.chunk(n))
    parts[rank] = x
    return torch.cat(parts, d)


def reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    """all_reduce(sum) into a fresh tensor (``x`` itself is left as it was).

    Eager, differentiable with an identity backward (DTensor's ``Partial -> Replicate``):
    the sum is written into a ``clone`` through a detached alias, so autograd sees only the
    clone. Under ``torch.compile`` the functional all_reduce (no autograd: wrapped by
    :func:`~hpcodegen.runtime.collectives.transition.lowered_fn` when a gradient flows).
    """
    comm = group if type(group) is Comm else Comm(group)
    if compiling():
        group_, _, _ = comm.traced()
        return funcol.all_reduce(x, "sum", group_)
    out = x.clone(memory_format=torch.contiguous_format)
    # c10d writes in place: through a detached alias when autograd records the clone
    (comm.pg or comm.resolve()).allreduce([out.detach() if out.requires_grad else out],
                                          comm.sum_opts).wait()
    return out


def local_chunk(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """This rank's chunk of ``x`` on ``dim`` (torch.chunk's split, as DTensor's Shard)."""
    comm = as_comm(group)
    n, rank = comm.size_rank()
    return chunk_of(x, dim % x.dim(), n, rank)


def chunk_of(x: torch.Tensor, d: int, n: int, rank: int) -> torch.Tensor:
    """Chunk ``rank`` of ``n`` of ``x`` on dim ``d`` (an empty one past the last chunk)."""
    parts = torch.chunk(x, n, d)
    if rank < len(parts):
        return parts[rank].contiguous()
    shape = list(x.shape)
    shape[d] = 0
    return x.new_empty(shape)


def scatter(x: torch.Tensor, dim: int, group: Any, world: int | None = None) -> torch.Tensor:
    """reduce_scatter(sum) on ``dim``; all_reduce + chunk when the dim does not divide."""
    comm = as_comm(group)
    d = dim % x.dim()
    if compiling():
        group_, n, _ = comm.traced()
        if x.shape[d] % n:
            return local_chunk(reduce(x, comm), d, comm)
        return funcol.reduce_scatter_tensor(
            x.contiguous(), "sum", d, group_)
    pg = comm.resolve()
    n = comm.size
    if x.shape[d] % n:
        return local_chunk(reduce(x, comm), d, comm)
    # the c10d op scatters dim 0: lay the chunks of ``d`` out one after the other
    src = x.contiguous() if d == 0 else torch.cat(torch.chunk(x, n, d))
    out = src.new_empty((src.shape[0] // n, *src.shape[1:]))
    pg.reduce_scatter_single(out, src, comm.scatter_opts).wait()
    return out


def step_fn(kind: str, dim: int | None, group: Any, where: str) -> LocalFn:
    """The local function of one collective kind on the tp group."""
    comm = as_comm(group)  # partials, not lambdas: no Python frame of their own per call
    if kind == "all_gather":
        return functools.partial(gather, dim=dim, group=comm)
    if kind == "all_reduce":
        return functools.partial(reduce, group=comm)
    if kind == "reduce_scatter":
        return functools.partial(scatter, dim=dim, group=comm)
    if kind == "chunk":
        return functools.partial(local_chunk, dim=dim, group=comm)
    raise PlanError([error("runtime.unlowerable", where,
                           f"cannot run {kind} as a lowered tp collective")])
