"""The kept gloo world of the multi-rank tests (``hpcodegen.parity.ranks.GlooWorld``):
results in rank order from real collectives, one intra-op thread per rank (as torchrun's
``OMP_NUM_THREADS=1``; a fork of the preloaded server would otherwise keep the server's
thread count), and a rank that raises fails the call with its traceback and ends the world,
so the next check starts on fresh ranks."""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(400)]


def _sum_of_ranks() -> dict:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "sum": float(t), "pid": os.getpid(),
            "threads": torch.get_num_threads()}


def _rank_one_raises() -> dict:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank one's mistake")
    return {}


def test_a_failing_rank_fails_the_call_and_the_next_one_runs_fresh(gloo) -> None:
    first = gloo(2, _sum_of_ranks)
    assert [r["rank"] for r in first] == [0, 1] and {r["sum"] for r in first} == {1.0}
    assert [r["threads"] for r in first] == [1, 1]
    assert gloo(2, _sum_of_ranks) == first  # the same processes, kept
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 raised.*rank one's mistake"):
        gloo(2, _rank_one_raises)
    again = gloo(2, _sum_of_ranks)
    assert [r["sum"] for r in again] == [1.0, 1.0] and [r["threads"] for r in again] == [1, 1]
    assert {r["pid"] for r in again}.isdisjoint({r["pid"] for r in first})
