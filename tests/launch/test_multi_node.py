"""Two launchers on this host act as two nodes (static rendezvous through torchrun)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from launch_helpers import EXAMPLE, LLAMA_CONFIG, REPO, check_in_process


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_two_nodes_one_rank_each(tmp_path):
    # both launchers read this verdict: no model-check child per node (two at once, each
    # importing torch, when the bytes were not checked earlier in the run)
    check_in_process(EXAMPLE, LLAMA_CONFIG)
    port = str(_free_port())
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "hpcodegen", "launch", str(EXAMPLE), "--nproc", "1",
         "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
         "--master-port", port, "--device", "cpu", "--model-dir", str(LLAMA_CONFIG),
         "--check-parity", "--timeout", "300", "--json", "--log-dir", str(tmp_path / str(node))],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)]
    docs = []
    for proc in nodes:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
        docs.append(json.loads(out))
    assert [[r["rank"] for r in d["ranks"]] for d in docs] == [[0], [1]]
    for doc in docs:
        (rank,) = doc["ranks"]
        assert rank["world_size"] == 2 and rank["status"] == "ok"
        assert rank["parity"]["grad_max_diff"] <= 1e-5
        assert doc["message"].startswith("1 rank ok")
