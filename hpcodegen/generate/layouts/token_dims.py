"""With ``--sp``: which tensor dim holds the tokens, per sequence-sharded transition.

Lifting writes every sequence-sharded transition as ``S(1)``: the sequence dim of the
``(batch, seq, hidden)`` activations between layers. A mixture-of-experts block flattens
its tokens to ``(batch*seq, hidden)`` rows before the router, so its experts (and, in some
families, its shared experts) take rows: there the tokens are dim 0. One meta-device run
(torch's fake tensors, ``(B, L)`` token ids with ``B*L`` distinct from every other size)
records the shape of each boundary's inputs and outputs, and each ``S(1)`` becomes the dim
the traced tensor holds its tokens on: ``1`` for ``(B, L, ...)``, ``0`` for ``(B*L, ...)``.

A rank then holds ``B*L/tp`` rows, and a gather on dim 0 concatenates the ranks' rows
rank-major, not in batch-major order: exact only for compute that treats every row on its
own. That is what a mixture-of-experts block is (each token is routed, computed and
weighted alone: transformers' ``forward(hidden_states, top_k_index, top_k_weights)``
contract), so rows are accepted inside one; anywhere else, and for a tensor with neither
layout, the plan is refused (``generate.sp_token_dim``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.layouts.entries import SEQ
from hpcodegen.generate.sources.globs import relative_to
from hpcodegen.placement import Shard
from hpcodegen.plan.draft import DraftEntry, DraftPlan
from hpcodegen.tracer.hooks import Recording, record_tensors, removed
from hpcodegen.tracer.model import forward

#: token rows (``(batch*seq, ...)``): the tokens on dim 0
ROWS = Shard(0)
#: the traced batch and length: their product is no other size of a tiny or real model
BATCH, LENGTH = 3, 7


def _record(model: Any, fqns: Iterable[str]) -> dict[tuple[str, str, Any], tuple[int, ...]]:
    """``{(fqn, "in", name) or (fqn, "out", index): shape}`` of one fake-tensor forward
    (the tracer's); empty when the model cannot run on meta (data-dependent code)."""
    modules = {fqn: model.get_submodule(fqn) if fqn else model for fqn in fqns}
    recording = Recording()
    try:
        with removed(record_tensors(modules, recording)):
            forward(model, BATCH, LENGTH, fake=True)
    except Exception:  # data-dependent code cannot run on meta: nothing is retargeted
        return {}
    return {key: shape for key, (shape, _) in recording.tensors.items()}


def token_dim(shape: tuple[int, ...] | None) -> int | None:
    """1 for ``(B, L, ...)``, 0 for ``(B*L, ...)`` rows, None for neither (or untraced)."""
    if shape is None:
        return None
    if len(shape) >= 2 and shape[:2] == (BATCH, LENGTH):
        return 1
    if len(shape) >= 1 and shape[0] == BATCH * LENGTH:
        return 0
    return None


def _seq_names(entry: DraftEntry, side: str) -> list[str]:
    return sorted({name for key in (f"{side}_src", f"{side}_dst")
                   for name, named in entry.placements(key).items()
                   if named.get("tp") == SEQ})


def retarget_token_dims(model: Any, plan: DraftPlan,
                        moe_blocks: Iterable[str]) -> list[str]:
    """Rewrite each sequence-sharded transition to the dim its traced tensor holds tokens on
    (in place); returns the FQNs whose transitions now shard rows (dim 0).

    ``moe_blocks`` are the modules whose compute is per token (the parents of the
    ``experts`` modules); rows are accepted inside them only.

    Raises:
        PlanError: a transition's tensor is neither ``(batch, seq, ...)`` nor token rows, or
            holds rows outside a mixture-of-experts block (``generate.sp_token_dim``).
    """
    wanted = [f for f, e in plan.items() if e.boundary
              and (_seq_names(e, "in") or _seq_names(e, "out"))]
    blocks = list(moe_blocks)
    if not wanted or not blocks:  # only MoE blocks flatten tokens in the plans we write
        return []
    shapes = _record(model, wanted)
    if not shapes:
        return []
    rows: list[str] = []
    problems = []
    for fqn in wanted:
        entry = plan[fqn]
        typed = entry.view()
        dims = {}
        for side in ("in", "out"):
            for name in _seq_names(entry, side):
                key = name if side == "in" else typed.output_index(name)
                dims[(side, name)] = token_dim(shapes.get((fqn, side, key)))
        if not any(d == 0 for d in dims.values()):
            continue
        inside = any(relative_to(fqn, b) not in (None, "") for b in blocks)
        bad = [f"{side}put {name!r}" for (side, name), d in dims.items() if d is None]
        if bad or not inside:
            problems.append(error(
                "generate.sp_token_dim", fqn,
                f"with sequence parallelism (--sp) {fqn} takes token rows (batch x sequence "
                "flattened)" + (f", and its {', '.join(bad)} has no token dim" if bad else "")
                + ("" if inside else ": outside a mixture-of-experts block nothing says its "
                   "compute treats each row on its own, which a gather of the ranks' rows "
                   "needs"), hint="generate without --sp"))
            continue
        for (side, name), dim in dims.items():
            for key in (f"{side}_src", f"{side}_dst"):
                named = entry.placement(key, name)
                if dim == 0 and named is not None and named.get("tp") == SEQ:
                    entry.place(key, name, {**named, "tp": ROWS})
        rows.append(fqn)
    if problems:
        raise PlanError(problems)
    return rows
