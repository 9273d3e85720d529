"""The HF tensor-parallel style names, of both generations, mapped to what we lift (pure).

transformers renamed its styles in 5.1 (``colwise_rep`` became ``colwise_gather_output``,
embeddings got their own names, ``replicated_with_grad_allreduce`` appeared). A plan from
either generation reads the same here. A style that is not in :data:`STYLE_KINDS` is an
error naming the rule: we never skip a rule silently.
"""

from __future__ import annotations

from enum import Enum

from hpcodegen.placement import REPLICATE, Placement, Shard, StridedShard


class Kind(str, Enum):
    """What a style does to its module, in terms the lifter understands."""

    #: a Linear sharded on its output features; lifted into its parent's boundary
    COLWISE = "colwise"
    #: a Linear sharded on its input features; its output is partial, reduced by the parent
    ROWWISE = "rowwise"
    #: a standalone colwise Linear whose output is gathered (lm_head)
    COLWISE_GATHER = "colwise_gather"
    #: a standalone rowwise Linear taking a replicated input: it splits the input on the
    #: last dim itself, its partial output is reduced (HF pairs it with a gathered colwise)
    ROWWISE_SPLIT = "rowwise_split"
    #: an Embedding sharded on the vocab (rows): output partial, reduced after
    EMBED_VOCAB = "embed_vocab"
    #: an Embedding sharded on the hidden dim (columns): output gathered on the last dim
    EMBED_HIDDEN = "embed_hidden"
    #: parameters replicated, no communication
    REPLICATE = "replicate"
    #: parameters replicated whose gradient is partial over tp (per-head norms)
    REPLICATE_GRAD = "replicate_grad"
    #: a norm on sequence-sharded activations (a boundary with identity transitions)
    NORM = "norm"
    #: a module whose output is all-reduced; its ``local_*`` descendants hold the shards
    REDUCE_OUTPUT = "reduce_output"
    #: shard like colwise / rowwise, but the communication belongs to an ancestor
    LOCAL_COLWISE = "local_colwise"
    LOCAL_ROWWISE = "local_rowwise"
    #: a mixture-of-experts ``experts`` module: every input replicated (their gradients
    #: all-reduced), the partial output all-reduced; its packed expert parameters hold the
    #: shards (HF's ``moe_tp_experts``)
    MOE_EXPERTS = "moe_experts"
    #: a region's module whose forward runs on its own sharded parameters as local tensors
    #: (HF ``local_params``, on an attention owning per-head ``sinks``): what every region
    #: of ours already does, so nothing to add; outside a region it is refused
    LOCAL_PARAMS = "local_params"
    #: MLA's ``kv_a_proj_with_mqa`` (HF ``mla_kv_a_proj``): a replicated Linear inside the
    #: attention whose output feeds both the colwise ``kv_b_proj`` and, as the rope part,
    #: the split heads directly; inside our region it is a replicated parameter whose
    #: gradient is partial over tp (HF all-reduces the rope part's gradient instead: the
    #: same sum); outside a region it is refused
    MLA_KV_A = "mla_kv_a"
    #: an RMS norm over the whole width of a colwise projection, run on the rank's features
    #: with the sum of squares all-reduced (:mod:`hpcodegen.runtime.norms`); a boundary of
    #: its own inside the region (never an HF style: the Megatron layouts pass sets it)
    SHARDED_NORM = "sharded_norm"


#: style name -> (kind, shard factor for packed weights, 1 otherwise)
STYLE_KINDS: dict[str, tuple[Kind, int]] = {
    # both generations
    "colwise": (Kind.COLWISE, 1),
    "rowwise": (Kind.ROWWISE, 1),
    "sequence_parallel": (Kind.NORM, 1),
    "replicate": (Kind.REPLICATE, 1),
    # pre-5.1
    "colwise_rep": (Kind.COLWISE_GATHER, 1),
    "rowwise_rep": (Kind.ROWWISE, 1),
    "local_colwise": (Kind.LOCAL_COLWISE, 1),
    "local_rowwise": (Kind.LOCAL_ROWWISE, 1),
    "local": (Kind.REPLICATE, 1),
    "gather": (Kind.REDUCE_OUTPUT, 1),
    # 5.1+
    "colwise_gather_output": (Kind.COLWISE_GATHER, 1),
    "rowwise_split_input": (Kind.ROWWISE_SPLIT, 1),
    "embedding_rowwise": (Kind.EMBED_VOCAB, 1),
    "embedding_colwise": (Kind.EMBED_HIDDEN, 1),
    "replicated_with_grad_allreduce": (Kind.REPLICATE_GRAD, 1),
    "packed_colwise": (Kind.COLWISE, 2),
    "packed_rowwise": (Kind.ROWWISE, 2),
    "all_reduce": (Kind.REDUCE_OUTPUT, 1),
    "moe_tp_experts": (Kind.MOE_EXPERTS, 1),
    "local_params": (Kind.LOCAL_PARAMS, 1),
    "mla_kv_a_proj": (Kind.MLA_KV_A, 1),
}

#: kinds a rule may give a *parameter* (HF 5.x plans name packed expert weights directly,
#: e.g. ``layers.*.mlp.experts.gate_up_proj: packed_colwise``)
PARAM_KINDS = frozenset({Kind.COLWISE, Kind.ROWWISE, Kind.REPLICATE, Kind.REPLICATE_GRAD,
                         Kind.LOCAL_COLWISE, Kind.LOCAL_ROWWISE})


#: packed styles whose factor may be given as ``<style>:<n>`` (a fused q|k|v is 3 blocks);
#: transformers' own names mean 2 blocks (a fused gate|up)
PACKED_STYLES = ("packed_colwise", "packed_rowwise")


def style_kind(style: str) -> tuple[Kind, int] | None:
    """The kind and packing factor of a style name, None when unsupported.

    ``packed_colwise:3`` is a packed style with an explicit number of fused blocks (the
    package rules use it for a fused q|k|v); transformers' names carry no factor.
    """
    name, sep, factor = style.partition(":")
    if sep:
        if name not in PACKED_STYLES or not factor.isdigit() or int(factor) < 1:
            return None
        return STYLE_KINDS[name][0], int(factor)
    return STYLE_KINDS.get(style)


def param_shard(kind: Kind, ndim: int, factor: int) -> tuple[Placement, bool]:
    """The placement HF gives a parameter of ``ndim`` dims, and whether it is a rowwise bias.

    HF reads every weight as ``[..., out, in]``: colwise shards dim ``ndim-2`` (a 1-D bias its
    only dim), rowwise dim ``ndim-1``; a rowwise 1-D bias stays replicated (added once after
    the reduction). Packed weights (``factor`` > 1) shard strided, as HF's packed styles.
    """
    col = kind in (Kind.COLWISE, Kind.LOCAL_COLWISE)
    if ndim <= 1:
        return (Shard(0), False) if col else (REPLICATE, True)
    return shard(ndim - 2 if col else ndim - 1, factor), False


def shard(dim: int, factor: int) -> Placement:
    """``S(dim)``, or the strided ``SS(dim,factor)`` of a packed (fused) weight."""
    return Shard(dim) if factor == 1 else StridedShard(dim, factor)
