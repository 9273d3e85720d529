"""The ops the derivation computes on each rank's local shard, as the runtime's code does.

Why: DTensor's own rule for a few ops would gather where the runtime's local code does not
(a strided slice of a fused projection, a split of interleaved rows, a row-wise op on a
sequence shard flattened into tokens, ``new_*`` of a shard, a partial scaled by a scalar).
The derivation installs these as DTensor custom op handlers for the length of one run
(:func:`local_rules`), so what it derives is what each rank computes; each handler falls
back to DTensor's own rule (:func:`_default`) where its local form does not apply.
"""

from __future__ import annotations

from typing import Any

#: the derivation run in progress (its handlers reach the run's state through this)
CURRENT: list[Any] = []


def local_rules(aten: Any) -> dict[Any, Any]:
    """``aten`` op -> the handler that computes it on the local shard."""
    return {aten.slice.Tensor: _strided_slice, aten.split.Tensor: _strided_split,
            aten.new_empty.default: _like_self, aten.new_zeros.default: _like_self,
            aten.new_ones.default: _like_self, aten.new_full.default: _like_self,
            aten.mul.Tensor: _scaled_partial,
            **dict.fromkeys(_row_ops(aten), _rowwise_strided)}


def _strided_slice(op_call: Any, args: tuple, kwargs: dict) -> Any:
    """``x[..., k::step]`` over a dim sharded in chunks of a multiple of ``step``, as the
    runtime's local code computes it: each rank takes the same stride of its own chunk
    (interleaved pairs such as GPT-OSS ``gate_up_proj`` stay whole on every rank). DTensor
    has no such rule and would gather the dim first; anything else takes its normal path."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor.placement_types import _StridedShard

    x, dim, start, end, step = [*args, *(None, 0, None, None, 1)[len(args):]][:5]
    dim = kwargs.get("dim", dim) % x.dim()
    start, end = kwargs.get("start", start), kwargs.get("end", end)
    step = kwargs.get("step", step) or 1
    local = x._local_tensor
    sharded = [p for p in x.placements if isinstance(p, TShard) and p.dim == dim]
    whole = end is None or end >= x.shape[dim]
    strided = [p for p in x.placements if isinstance(p, _StridedShard) and p.dim == dim]
    if strided and CURRENT and CURRENT[-1].stack:
        # a block of a fused weight's output (phi3's qkv[..., :q]) whose blocks DTensor
        # cannot express: this boundary is left to the rules, not guessed
        run = CURRENT[-1]
        run.opaque.setdefault(run.stack[-1], "a slice of a fused (SS) output, which "
                              "propagation cannot express")
    if step > 1 and sharded and whole and 0 <= (start or 0) < step \
            and local.shape[dim] % step == 0 and x.shape[dim] % step == 0:
        out = torch.ops.aten.slice.Tensor(local, dim, start or 0, None, step)
        shape = list(x.shape)
        shape[dim] = x.shape[dim] // step
        return DTensor.from_local(out, x.device_mesh, x.placements, run_check=False,
                                  shape=tuple(shape), stride=out.stride())
    return _default(op_call, args, kwargs)


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _strided_split(op_call: Any, args: tuple, kwargs: dict) -> Any:
    """A tensor sharded ``SS(d,k)`` (k blocks, each split over the ranks: a fused
    ``gate_up_proj``) split along ``d`` into its k blocks, as the runtime's local code
    computes it: each rank's local tensor splits into its k local blocks, each block
    ``S(d)``. DTensor has no such rule and would gather first; anything else takes its
    normal path."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor.placement_types import _StridedShard

    x, size = args[0], args[1]
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % x.dim()
    strided = [p for p in x.placements if isinstance(p, _StridedShard) and p.dim == dim]
    if isinstance(size, int) and len(strided) == 1 and size * strided[0].split_factor \
            == x.shape[dim] and x._local_tensor.shape[dim] % strided[0].split_factor == 0:
        k = strided[0].split_factor
        pieces = torch.ops.aten.split.Tensor(x._local_tensor,
                                             x._local_tensor.shape[dim] // k, dim)
        placements = tuple(TShard(dim) if p is strided[0] else p for p in x.placements)
        shape = list(x.shape)
        shape[dim] = size
        return [DTensor.from_local(piece, x.device_mesh, placements, run_check=False,
                                   shape=tuple(shape), stride=piece.stride())
                for piece in pieces]
    return _default(op_call, args, kwargs)


def _row_ops(aten: Any) -> list[Any]:
    """Ops an MoE router runs on tokens flattened from a sequence shard (``SS(0,b)``: the
    rows of each rank interleaved across the batch), for which DTensor has no strided rule
    and would gather the rows first (:func:`_rowwise_strided`)."""
    return [aten.topk.default, aten.sort.default, aten.sort.stable, aten.max.dim,
            aten.argmax.default, aten.scatter.src, aten.scatter.value,
            aten.scatter_.src, aten.scatter_.value,
            aten.scatter_add.default, aten.gather.default, aten.one_hot.default,
            aten.mm.default]


def _rowwise_strided(op_call: Any, args: tuple, kwargs: dict) -> Any:
    """An op on rows sharded ``SS(d,k)`` as each rank's local code runs it: on its own rows.

    A strided shard holds the same number of rows per rank as ``S(d)``, only other ones (a
    permutation of the rows). If DTensor's rule for the op keeps ``S(d)`` operands where
    they are (no collective), the op is row-wise on ``d``: it gives each rank's rows the
    same answer whichever rows they are, so the result is the ``S(d)`` result with its
    ``d`` read back as ``SS(d,k)``. Otherwise (or without a strided operand) DTensor's own
    rule runs, and a gather it needs is recorded as before."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor.placement_types import _StridedShard
    from torch.utils import _pytree as pytree

    if not any(isinstance(t, DTensor) and any(isinstance(p, _StridedShard)
                                              for p in t.placements)
               for t in (*args, *kwargs.values())):
        # the common case (every matmul of a dense model): no strided operand at the top
        # level, where these ops take their tensors; DTensor's own rule, without
        # flattening the call
        return _default(op_call, args, kwargs)
    leaves, spec = pytree.tree_flatten((args, kwargs))
    dtensors = [t for t in leaves if isinstance(t, DTensor)]
    strided = {(i, p.dim): p for t in dtensors
               for i, p in enumerate(t.placements) if isinstance(p, _StridedShard)}
    factors = {i: p.split_factor for (i, _), p in strided.items()}
    # every operand split over a mesh dim of a strided operand holds its rows the same way
    # (one split factor, no plain shard beside it): their local rows then pair up
    consistent = all(
        isinstance(p, _StridedShard) and p.split_factor == factors[i]
        for t in dtensors for i, p in enumerate(t.placements)
        if i in factors and (isinstance(p, (TShard, _StridedShard))))
    run = CURRENT[-1] if CURRENT else None
    if not strided or run is None or not consistent:
        return _default(op_call, args, kwargs)

    def as_rows(t: Any) -> Any:
        if not isinstance(t, DTensor):
            return t
        placements = tuple(TShard(p.dim) if isinstance(p, _StridedShard) else p
                           for p in t.placements)
        return DTensor.from_local(t._local_tensor, t.device_mesh, placements,
                                  run_check=False, shape=t.shape, stride=t.stride())

    marks = (len(run.record.implicit), run.record.backward_reductions)
    trial_args, trial_kwargs = pytree.tree_unflatten([as_rows(t) for t in leaves], spec)
    out = _default(op_call, trial_args, trial_kwargs)
    moved = (len(run.record.implicit), run.record.backward_reductions) != marks
    del run.record.implicit[marks[0]:]
    run.record.backward_reductions = marks[1]
    if moved:
        return _default(op_call, args, kwargs)

    def back(t: Any) -> Any:
        if not isinstance(t, DTensor):
            return t
        placements = tuple(strided.get((i, p.dim), p) if type(p) is TShard else p
                           for i, p in enumerate(t.placements))
        return DTensor.from_local(t._local_tensor, t.device_mesh, placements,
                                  run_check=False, shape=t.shape, stride=t.stride())
    return pytree.tree_map(back, out)


def _like_self(op_call: Any, args: tuple, kwargs: dict) -> Any:
    """``x.new_empty(size)`` (``new_zeros``, ``new_ones``, ``new_full``) of ``x``'s shape
    on every dim ``x`` is sharded on, as the runtime's local code makes it: a tensor of the
    local shape, so sharded like ``x``. DTensor makes it replicated (a global tensor) and
    the copies into it would gather; anything else takes its normal path."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import _StridedShard

    x, size = args[0], list(args[1])
    dims = [p.dim for p in x.placements if isinstance(p, TShard)]
    if isinstance(x, DTensor) and dims and len(size) == x.dim() \
            and all(size[d] == x.shape[d] for d in dims) \
            and not any(isinstance(p, _StridedShard) or p.is_partial()
                        for p in x.placements):
        local_shape, _ = compute_local_shape_and_global_offset(size, x.device_mesh,
                                                               x.placements)
        local = op_call(x._local_tensor, list(local_shape), *args[2:], **kwargs)
        return DTensor.from_local(local, x.device_mesh, x.placements, run_check=False,
                                  shape=torch.Size(size),
                                  stride=torch.empty(size, device="meta").stride())
    return _default(op_call, args, kwargs)


def _scaled_partial(op_call: Any, args: tuple, kwargs: dict) -> Any:
    """A partial sum times a replicated scalar (one element: Gemma's ``embed_scale``) stays
    a partial sum, as the local code computes it (the product is linear); DTensor would
    reduce first. Anything else takes its normal path."""
    from torch.distributed.tensor import DTensor

    def is_partial(x: Any) -> bool:
        return isinstance(x, DTensor) and any(p.is_partial() for p in x.placements)

    def is_scalar(x: Any) -> bool:
        if isinstance(x, DTensor):
            return x.numel() == 1 and all(p.is_replicate() for p in x.placements)
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return True
        return hasattr(x, "numel") and x.numel() == 1

    a, b = args[0], args[1]
    if not is_partial(a):
        a, b = b, a
    partial, scalar = is_partial(a), is_scalar(b)
    if partial and scalar and not kwargs:
        other = b.to_local() if isinstance(b, DTensor) else b
        local = op_call(a._local_tensor, other)
        return DTensor.from_local(local, a.device_mesh, a.placements, run_check=False,
                                  shape=local.shape, stride=local.stride())
    return _default(op_call, args, kwargs)


def _default(op_call: Any, args: tuple, kwargs: dict) -> Any:
    """DTensor's own rule for ``op_call`` (the custom handler set aside for the call)."""
    from torch.distributed.tensor import DTensor

    handlers = DTensor._op_dispatcher._custom_op_handlers
    mine = handlers.pop(op_call)
    try:
        return op_call(*args, **kwargs)
    finally:
        handlers[op_call] = mine
