"""Two launchers on this host act as two nodes (static rendezvous through torchrun).

The launch is the session's ``two_nodes`` (:func:`launch_helpers.launch_two_nodes`): one
rank per node, ``--check-parity`` and ``--save`` from a transformers-saved model dir, which
``test_checkpoints.py``'s sharded load -> save -> export reads too. Here: each launcher
reports its own node's rank, both ranks formed one world of 2, and parity held across it.
"""

from __future__ import annotations

import pytest


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_two_nodes_one_rank_each(two_nodes):
    for node, run in enumerate(two_nodes.runs):
        assert run.code == 0, (node, run.stdout + run.stderr)
    docs = [run.json() for run in two_nodes.runs]
    assert [[r["rank"] for r in d["ranks"]] for d in docs] == [[0], [1]]
    for doc in docs:
        (rank,) = doc["ranks"]
        assert rank["world_size"] == 2 and rank["status"] == "ok"
        assert rank["parity"]["grad_max_diff"] <= 1e-5
        assert doc["message"].startswith("1 rank ok")
