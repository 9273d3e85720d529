"""The ``pipeline`` section of a meta: a frozen pipeline-parallel plan (declaration, pure).

The existing system writes ``parallel_dims.pp_size`` but no split; hpcodegen adds one
top-level key (unknown keys are allowed by that system), parsed by
:mod:`hpcodegen.plan.codec` into these types::

    "pipeline": {
      "pp_size": 2, "schedule": "1F1B", "style": "loop", "stages_per_rank": 1,
      "n_microbatches": 4, "microbatch_dim": 0,
      "module_order": ["model.embed_tokens", "model.layers.0", ..., "model.norm", "lm_head"],
      "replicated_modules": ["model.rotary_emb"],
      "stages": [{"index": 0, "rank": 0, "modules": ["model.embed_tokens", ...]}, ...],
      "boundary": {"activation": "hidden_states", "placements": {"tp": "S(1)"},
                   "side_inputs": {"position_ids": "recomputed", ...}},
      "tied_across_stages": [{"params": ["model.embed_tokens.weight", "lm_head.weight"],
                              "stages": [0, 1], "grad": "sum"}],
      "loss": {"reduction": "sum", "normalizer": "global_valid_tokens", "scale_grads": false},
      "actions": {"0": ["0F0", "0SEND_F0", ...], "1": [...]},
      "actions_sha256": "..."
    }

Module FQNs are the model's own, unchanged, so checkpoint keys do not depend on the split.
The action list is frozen whole (verify simulates it, :mod:`hpcodegen.plan.schedule_sim`);
the digest pins it against drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcodegen.placement import Placement, Shard
from hpcodegen.plan.frozen import EMPTY, FrozenMap

#: The loss contract hpcodegen freezes: each microbatch's loss is a *sum* over its tokens,
#: the step's loss is the sum over microbatches divided by the global count of valid
#: tokens, and torch's schedule must not rescale gradients (``scale_grads=False``).
LOSS_REDUCTION = "sum"
LOSS_NORMALIZER = "global_valid_tokens"


def boundary_placements(*, sp: bool, cp: int) -> dict[str, str]:
    """How the hidden states cross a stage boundary, per mesh axis (absent = ``R``).

    Between decoder layers the hidden states are sequence-sharded (``S(1)``) over tp under
    sequence parallelism and over cp whenever cp > 1 (each cp rank holds its own positions
    of the sequence, in the frozen cp layout's order): a stage sends what its last layer
    holds, so the boundary is sharded the same way. generate writes this and verify
    compares with it (one rule for both)."""
    seq = str(Shard(1))
    out: dict[str, str] = {}
    if sp:
        out["tp"] = seq
    if cp > 1:
        out["cp"] = seq
    return out


def owning_stage(fqn: str, owner: Mapping[str, int]) -> int | None:
    """The stage of the longest prefix of ``fqn`` in ``owner`` (module FQN -> stage);
    None when no prefix is owned. A parameter belongs to the stage owning its module."""
    parts = fqn.split(".")
    for i in range(len(parts), 0, -1):
        stage = owner.get(".".join(parts[:i]))
        if stage is not None:
            return stage
    return None


def fold_modules(modules: Sequence[str]) -> str:
    """``model.layers.{0..3}`` for a run of one layer list, other names as they are."""
    from hpcodegen.plan.fold import format_ranges  # plan.fold imports the plan types

    out: list[str] = []
    i = 0
    while i < len(modules):
        prefix, _, last = modules[i].rpartition(".")
        j, indices = i, []
        while last.isdigit() and j < len(modules):
            p, _, index = modules[j].rpartition(".")
            if p != prefix or not index.isdigit():
                break
            indices.append(int(index))
            j += 1
        if len(indices) > 1:
            out.append(f"{prefix}.{{{format_ranges(indices)}}}")
            i = j
        else:
            out.append(modules[i])
            i += 1
    return ", ".join(out)


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineStage:
    """One stage: the modules it owns, in forward order, and the rank running it."""

    index: int
    """``index``: the global stage number, 0 = the stage fed the input ids."""
    rank: int
    """``rank``: the pp rank running it (the schedule's stage -> rank map)."""
    modules: tuple[str, ...]
    """``modules``: owned module FQNs in forward order, e.g. ``("model.layers.2",)``."""
    params: int | None = None
    """``params``: parameters the stage owns (unsharded; a tied copy counts on each stage)."""
    params_per_rank: int | None = None
    """``params_per_rank``: what one rank of the stage holds after tp sharding."""
    extra: FrozenMap = EMPTY


@dataclass(frozen=True, kw_only=True, slots=True)
class StageBoundary:
    """What crosses every stage boundary, and what each stage rebuilds for itself."""

    activation: str
    """``activation``: the tensor sent forward (its gradient comes back), e.g.
    ``"hidden_states"`` of shape ``[microbatch, seq, hidden]``."""
    placements: FrozenMap[str, Placement] | None = None
    """``placements``: its placement over the stage's mesh, e.g. ``{"tp": S(1)}`` with
    sequence parallelism (each tp rank sends its shard), ``{}`` = replicated."""
    side_inputs: FrozenMap[str, str] | None = None
    """``side_inputs``: the other inputs of the layers and how a stage gets them,
    e.g. ``{"position_embeddings": "recomputed"}``: never sent."""
    extra: FrozenMap = EMPTY


@dataclass(frozen=True, kw_only=True, slots=True)
class TiedAcrossStages:
    """Parameters sharing one tensor but owned by different stages (a tied embedding and
    head): each stage holds a copy and their gradients are summed between the stages."""

    params: tuple[str, ...]
    """``params``: the tied parameter FQNs, e.g. ``("model.embed_tokens.weight",
    "lm_head.weight")``."""
    stages: tuple[int, ...]
    """``stages``: the stage owning each parameter, same order."""
    grad: str | None = None
    """``grad``: how the copies' gradients combine (``"sum"``: all-reduce between them)."""
    extra: FrozenMap = EMPTY


@dataclass(frozen=True, kw_only=True, slots=True)
class LossContract:
    """How the pipelined loss and gradients relate to the unsharded ones (exactly)."""

    reduction: str | None = None
    """``reduction``: each microbatch's loss over its tokens (``"sum"``)."""
    normalizer: str | None = None
    """``normalizer``: the step's divisor, ``"global_valid_tokens"`` (labels != -100 over
    the whole global batch, counted before the split)."""
    scale_grads: bool | None = None
    """``scale_grads``: torch's schedule option; ``False``, as its default ``True`` divides
    the gradients by the microbatch count a second time."""

    @property
    def exact(self) -> bool:
        """The contract hpcodegen runs: sum per microbatch, divided by the global count of
        valid tokens, gradients not rescaled by the schedule."""
        return (self.reduction == LOSS_REDUCTION and self.normalizer == LOSS_NORMALIZER
                and self.scale_grads is False)
    extra: FrozenMap = EMPTY


@dataclass(frozen=True, kw_only=True, slots=True)
class Pipeline:
    """The ``pipeline`` section: the split, the schedule and its frozen action list."""

    pp_size: int
    """``pp_size``: pipeline ranks (equals ``parallel_dims.pp_size``)."""
    schedule: str
    """``schedule``: ``"GPipe"``, ``"1F1B"``, ``"Interleaved1F1B"``, ``"ZBVZeroBubble"`` or
    ``"DualPipeV"``."""
    style: str
    """``style``: the stage -> rank map, ``"loop"`` (rank + s*pp) or ``"v"``."""
    stages_per_rank: int
    """``stages_per_rank``: 1, or 2+ for interleaved and V schedules."""
    n_microbatches: int
    """``n_microbatches``: microbatches per step, split along :attr:`microbatch_dim`."""
    stages: tuple[PipelineStage, ...]
    """``stages``: by index."""
    module_order: tuple[str, ...] | None = None
    """``module_order``: the split units in the model's forward order, as generate saw it."""
    microbatch_dim: int | None = None
    """``microbatch_dim``: the batch dim the global batch is chunked along."""
    replicated_modules: tuple[str, ...] | None = None
    """``replicated_modules``: parameter-free modules every stage keeps (rotary)."""
    boundary: StageBoundary | None = None
    """``boundary``: what crosses each stage boundary."""
    tied_across_stages: tuple[TiedAcrossStages, ...] | None = None
    """``tied_across_stages``: tied parameters owned by different stages."""
    loss: LossContract | None = None
    """``loss``: the loss contract (absent: nothing is assumed; verify asks for it).
    A field of this section that is None was absent from the JSON."""
    actions: FrozenMap[str, tuple[str, ...]] | None = None
    """``actions``: rank (as a string) -> its actions in order, e.g. ``("0F0", "0SEND_F0")``."""
    actions_sha256: str | None = None
    """``actions_sha256``: :func:`hpcodegen.plan.schedule.actions_digest` of :attr:`actions`."""
    extra: FrozenMap = EMPTY

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    def stage_of(self) -> dict[str, int]:
        """Owned module FQN -> its stage index (the first when listed twice)."""
        out: dict[str, int] = {}
        for stage in self.stages:
            for fqn in stage.modules:
                out.setdefault(fqn, stage.index)
        return out

    def owner(self, fqn: str) -> int | None:
        """The stage owning module or parameter ``fqn`` (its owned prefix); None: no stage."""
        return owning_stage(fqn, self.stage_of())

    def ranks_stages(self, rank: int) -> list[int]:
        """The stage indices ``rank`` runs."""
        return [s.index for s in self.stages if s.rank == rank]
