"""The embedding rules, each in one home: ``takes_token_ids`` (class name) in
``hpcodegen.plan.entry``, ``output_sequence_sharded`` on the typed ``PlanEntry``, the instance check
``row_sharded_vocab_start`` in the runtime. No process group needed."""

from __future__ import annotations

import pytest

from hpcodegen.plan.codec import PlanFormatError, entry_from_json
from hpcodegen.plan.entry import takes_token_ids


def _entry(src: str, dst: str) -> dict:
    return {"in_src": {"input": {"tp": "R"}}, "in_dst": {"input": {"tp": "R"}},
            "out_src": {"output": {"tp": src}}, "out_dst": {"output": {"tp": dst}}}


@pytest.mark.parametrize(("cls", "want"), [
    ("Embedding", True), ("Gemma3TextScaledWordEmbedding", True), ("LlamaAttention", False),
    ("Linear", False), (None, False)])
def test_takes_token_ids_is_the_class_name_rule(cls, want) -> None:
    assert takes_token_ids(cls) is want


@pytest.mark.parametrize(("src", "dst", "want"), [
    ("P(sum)", "S(1)", True),   # embedding_rowwise + SP: reduce_scatter onto the sequence
    ("S(-1)", "S(1)", True),    # embedding_colwise + SP: the sequence is sharded too
    ("P(sum)", "R", False),     # no SP: all_reduce, the whole sequence
    ("S(-1)", "S(-1)", False),  # hidden-sharded only
])
def test_output_sequence_sharded_reads_only_the_exit_placement(src, dst, want) -> None:
    """Regression: the SP position-ids fix keyed on ``P -> S(1)`` and so missed a
    column-sharded embedding whose output also leaves sequence-sharded."""
    assert entry_from_json("embed", _entry(src, dst)).output_sequence_sharded() is want


def test_a_bad_placement_is_refused_before_it_is_read() -> None:
    for raw in (_entry("P(sum)", "S(x)"), {"out_dst": ["not", "a", "map"]}):
        with pytest.raises(PlanFormatError):
            entry_from_json("embed", raw)


def test_row_sharded_vocab_start_needs_an_embedding_instance_sharded_by_rows() -> None:
    from torch import nn
    from torch.distributed.tensor import Replicate, Shard

    from hpcodegen.runtime.embedding import row_sharded_vocab_start
    from hpcodegen.runtime.mesh import ActiveMesh
    from hpcodegen.runtime.params import ShardedParam

    active = ActiveMesh(("tp",), {"tp": 2}, None, None)
    rows = ShardedParam("embed.weight", (Shard(0),), (16, 4), (8, 0))
    cols = ShardedParam("embed.weight", (Shard(1),), (16, 4), (0, 2))
    whole = ShardedParam("embed.weight", (Replicate(),), (16, 4), (0, 0))
    emb = nn.Embedding(8, 4)
    assert row_sharded_vocab_start(emb, rows, active) == 8
    assert row_sharded_vocab_start(emb, cols, active) is None
    assert row_sharded_vocab_start(emb, whole, active) is None
    assert row_sharded_vocab_start(emb, None, active) is None
    assert row_sharded_vocab_start(nn.Linear(4, 8), rows, active) is None
    assert row_sharded_vocab_start(emb, rows, ActiveMesh(("cp",), {"cp": 2}, None, None)) is None


def test_vocab_parallel_lookups_sum_to_the_full_lookup() -> None:
    """Each rank's masked lookup of its rows (ids outside its range zeroed) sums to the
    full embedding, values and weight gradients, padding row included."""
    import copy

    import torch
    from torch import nn

    from hpcodegen.runtime.embedding import install_vocab_parallel

    torch.manual_seed(0)
    full = nn.Embedding(10, 4, padding_idx=7)
    ids = torch.tensor([[0, 3, 4, 5, 9, 7], [8, 1, 6, 2, 7, 4]])
    want = full(ids)
    want.pow(2).sum().backward()
    parts = []
    for start, end in ((0, 5), (5, 10)):
        shard = copy.deepcopy(full)  # as Phase A leaves it: the global padding_idx, local rows
        shard.weight = nn.Parameter(full.weight.detach()[start:end].clone())
        install_vocab_parallel(shard, start)
        parts.append((shard, shard(ids)))
    got = parts[0][1] + parts[1][1]
    assert torch.equal(got, want)
    got.pow(2).sum().backward()
    grads = torch.cat([shard.weight.grad for shard, _ in parts])
    assert torch.allclose(grads, full.weight.grad, atol=1e-6, rtol=0)
    assert not grads[7].any()  # the padding row gets no gradient on its owner rank
