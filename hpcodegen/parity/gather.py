"""The comparison rules of the parity harness: a sharded model's tensors against the
unsharded model's (logits, gradients, parameters).

Two directions, both used by the harness (:mod:`hpcodegen.parity.harness`):

* :func:`max_param_diff` gathers each local shard to the full tensor by the *plan's*
  placement and compares it with the reference's;
* :func:`max_shard_diff` cuts the reference tensor down to this rank's shard by the
  *runtime's* ``source_info`` (what ``parallelize_from_generated`` returned), so the
  placements the runtime reports are checked too (FSDP2 parameters are unsharded first).

Local shards are turned back into full tensors with DTensor (``from_local`` with the plan's
placements, then ``full_tensor``), so uneven and strided shards are handled by torch, and
the logits gather stays differentiable (the loss is taken on the full logits, the same
function on both models). A parameter's placement is the plan's (``Plan.parameters()``
resolved over the live active axes); replicated parameters are compared as they are, which also
checks that partial gradients (SP norms) were reduced by the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from hpcodegen.placement import Replicate, resolve_placements
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import NamedPlacement, Plan


def _is_dtensor(value: Any) -> bool:
    return hasattr(value, "full_tensor") and hasattr(value, "placements")


def _full(local: Any, active: Any, named: Mapping[str, Any] | None, like: Any) -> Any:
    """The full tensor of ``local`` placed by ``named`` on the active mesh (an expert
    parameter's on the expert mesh, when ``active`` is one)."""
    if _is_dtensor(local):
        return local.full_tensor()
    if getattr(active, "degenerate", False):
        return local
    placements = resolve_placements(named, active.axes)
    if all(isinstance(p, Replicate) for p in placements):
        return local
    from torch.distributed.tensor import DTensor

    from hpcodegen.runtime.mesh import to_torch_placements

    kwargs = {} if like is None else {"shape": like.shape, "stride": like.stride()}
    dt = DTensor.from_local(local, active.mesh, to_torch_placements(placements, local.ndim),
                            run_check=False, **kwargs)
    return dt.full_tensor()


def output_module_fqn(model: Any) -> str | None:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, module in model.named_modules():
        if module is head:
            return name
    return None


def full_logits(logits: Any, model: Any, plan: Plan, active: Any) -> Any:
    """Gather the model's logits per the plan's output placement of the LM head.

    The output placement is the head entry's ``out_dst`` (else ``out_src``) for its first
    output; a head outside the plan produces replicated logits. The cp axis is left alone:
    a cp rank's logits are its positions of the sequence in the layout's order, which
    :meth:`hpcodegen.runtime.cp.CPBatch.gather` puts back.
    """
    fqn = output_module_fqn(model)
    entry = plan.entries.get(fqn) if fqn is not None else None
    named = None
    if entry is not None and entry.boundary:
        outs = entry.out_dst or entry.out_src or EMPTY
        names = entry.output_names
        named = outs.get(names[0]) if names else None
    if named is not None:
        named = {axis: p for axis, p in named.items() if axis != "cp"}
    return _full(logits, active, named, None)


def plan_placements(plan: Plan) -> dict[str, NamedPlacement]:
    """``{param_fqn: named placement}`` for every planned parameter."""
    return {p.fqn: p.placements for p in plan.parameters()}


def max_param_diff(sharded: Any, reference: Any, plan: Plan, active: Any,
                   pick: Callable[[Any], Any], expert: Any = None,
                   names: Collection[str] | None = None
                   ) -> tuple[float, str | None, list[str]]:
    """Largest ``|pick(sharded p) - pick(reference p)|`` over all parameters.

    Args:
        pick: ``lambda p: p.grad`` or ``lambda p: p.data``.
        expert: the runtime's expert mesh (``runtime.experts.ExpertMesh``), if any: expert
            parameters are gathered over it.
        names: compare only these parameter FQNs (a pipeline rank's own stages), every
            FQN that names a parameter (tied names too); None: all.

    Returns:
        ``(max abs diff, FQN where it occurs, FQNs present on one side only)``.
    """
    placements = plan_placements(plan)
    ref_params = dict(reference.named_parameters())
    worst, where, odd = 0.0, None, []
    pairs = (sharded.named_parameters() if names is None else
             ((f, p) for f, p in sharded.named_parameters(remove_duplicate=False) if f in names))
    if names is not None:
        ref_params = dict(reference.named_parameters(remove_duplicate=False))
    for fqn, param in pairs:
        ref = ref_params.get(fqn)
        mine, theirs = pick(param), None if ref is None else pick(ref)
        if mine is None or theirs is None:
            if (mine is None) != (theirs is None):
                odd.append(fqn)
            continue
        named = placements.get(fqn)
        on = expert if expert is not None and named is not None and "ep" in named else active
        full = _full(mine.detach(), on, named, theirs)
        if tuple(full.shape) != tuple(theirs.shape):
            odd.append(fqn)
            continue
        diff = float((full.float() - theirs.detach().float()).abs().max()) if full.numel() else 0.0
        if where is None or diff > worst:
            worst, where = diff, fqn
    return worst, where, odd


def local_of(full: Any, placements: Sequence[Any], mesh: Any) -> Any:
    """The shard of ``full`` this rank holds under torch ``placements`` on ``mesh``."""
    from torch.distributed.tensor import Replicate as TReplicate
    from torch.distributed.tensor import distribute_tensor

    if all(isinstance(p, TReplicate) for p in placements):
        return full
    return distribute_tensor(full.detach().clone(), mesh, placements).to_local()


def max_shard_diff(sharded: Any, reference: Mapping[str, Any], info: Mapping[str, Any],
                   pick: Callable[[Any], Any]) -> tuple[float, str]:
    """Largest ``|pick(sharded p) - shard of reference[fqn]|``, the reference tensor cut by
    the runtime's ``source_info`` (``{fqn: (torch placements tuple, source mesh)}``).

    A DTensor parameter (the runtime's, or FSDP2's over dp and tp) is compared as its full
    tensor with the whole reference. Every placement must be a tuple (what FSDP2 requires).

    Returns:
        ``(max abs diff, FQN where it occurs)`` (``""`` when every diff is 0).
    """
    worst, where = 0.0, ""
    for fqn, param in sharded.named_parameters():
        value = pick(param)
        placements, source = info[fqn]
        assert isinstance(placements, tuple), (fqn, placements)  # FSDP2 needs a tuple
        if _is_dtensor(value):  # a DTensor parameter (FSDP2's too): the whole tensor
            mine, theirs = value.full_tensor(), reference[fqn]
        else:
            mine, theirs = value, local_of(reference[fqn], placements, source)
        diff = float((mine - theirs).abs().max())
        if diff > worst:
            worst, where = diff, fqn
    return worst, where
