"""The benchmarks' own correctness: the lower bound is a real equivalent, the lines parse.

The hand-written Megatron forward is the yardstick of ``forward_overhead.py``; if it computed
something cheaper than the model, every ratio against it would flatter nobody but be wrong.
At tp=1 (a one-rank gloo group) it must give transformers' logits and gradients.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import bench_main
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))


@pytest.fixture
def one_rank_mesh() -> Iterator[object]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_handwritten_forward_matches_transformers(one_rank_mesh: object) -> None:
    import common
    import forward_overhead as fo
    import torch

    config = common.tiny_llama_config(2, hidden=64, heads=4, kv_heads=2, vocab=128)
    model = common.build_model(config)
    hand = fo.HandwrittenLlama(common.build_model(config), one_rank_mesh)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))

    ref = model(input_ids=ids, use_cache=False).logits
    out = hand.forward(ids)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)

    ref.pow(2).mean().backward()
    out.pow(2).mean().backward()
    pairs = {"model.embed_tokens.weight": hand.embed, "lm_head.weight": hand.lm_head,
             "model.layers.1.self_attn.q_proj.weight": hand.layers[1]["q"],
             "model.layers.0.mlp.down_proj.weight": hand.layers[0]["down"]}
    for name, param in pairs.items():
        torch.testing.assert_close(param.grad, model.get_parameter(name).grad,
                                   atol=1e-6, rtol=1e-4, msg=name)


def test_linearity_helper_flags_a_quadratic_install() -> None:
    import install_time as it

    slope, grow, dev = it.linearity({8: 0.010 + 8e-3, 32: 0.010 + 32e-3, 64: 0.010 + 64e-3})
    assert slope == pytest.approx(1e-3) and dev == pytest.approx(0.0, abs=1e-12)
    assert grow < 8 and it.linear_word(dev) == "linear"
    _, _, dev_sq = it.linearity({n: (n / 8) ** 2 for n in (8, 32, 64)})
    assert it.linear_word(dev_sq) == "NOT linear"


def test_format_table_aligns_and_marks_missing_cells() -> None:
    import common

    text = common.format_table(["arm", "ms"], [["a", 1.23456], ["long name", None]])
    lines = text.splitlines()
    assert lines[0].split() == ["arm", "ms"] and set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["a", "1.235"] and lines[3].endswith("-")
    assert common.ratio(1.0, None) == "n/a" and common.ratio(3.0, 2.0) == "1.50"


def test_interleaved_timings_pair_rounds_and_shuffle_the_order() -> None:
    """Every arm gets one timed sample per round, aligned by round for ``paired_ratio``; the
    turn order changes between rounds (a fixed order biases equal arms)."""
    import common

    calls: list[str] = []
    arms = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    out = common.interleaved_timings(arms, warmup=1, rounds=6, settle=1)
    assert all(len(t["samples"]) == 6 for t in out.values())
    timed = calls[4:]  # after the warm-up: (settle, timed) per arm per round
    assert all(timed[i] == timed[i + 1] for i in range(0, len(timed), 2))
    orders = {tuple(timed[r * 8:(r + 1) * 8:2]) for r in range(6)}
    assert len(orders) > 1 and all(sorted(o) == list("abcd") for o in orders)
    slow, fast = {"samples": [2.0, 4.0, 9.0]}, {"samples": [1.0, 2.0, 3.0]}
    assert common.paired_ratio(slow, fast) == "2.00"  # per round: 2, 2, 3
    assert common.paired_ratio(slow, None) == "n/a"


LAST_LINES = {
    "cp.py": r"cp: balance_headtail=\d+\.\d{3} balance_contiguous=\d+\.\d{3} "
             r"kv_bytes_vs_expanded=\d+\.\d{3} activation_bytes_cp2_vs_cp1=\d+\.\d{3} "
             r"ulysses_vs_allgather_llama8b_cp8=(?P<ulysses>\d+\.\d{3})",
    "install_time.py": r"install_time: s_8_layers=\d+\.\d{3} vs_parallelize_module=\d+\.\d\d",
    "forward_overhead.py": r"forward_overhead: vs_parallelize_module=\d+\.\d\d "
                           r"vs_handwritten=\d+\.\d\d vs_hf_floor=\d+\.\d\d "
                           r"vs_hf_floor_bwd=\d+\.\d\d vs_hf_tp_plan=\d+\.\d\d "
                           r"compiled_vs_handwritten=\d+\.\d\d",
    "overhead_breakdown.py": r"overhead_breakdown: hpcodegen=\d+\.\d\d f_node_only=\d+\.\d\d "
                             r"no_f=\d+\.\d\d no_f_g_clone=\d+\.\d\d no_f_no_g=\d+\.\d\d",
}


#: each script's smoke arguments, and whether it runs in a fresh interpreter. cp.py,
#: install_time.py and overhead_breakdown.py run their ``main`` in the test's process
#: (``bench_main``: no second interpreter start and torch import, about half of each run's
#: CPU; overhead_breakdown puts forward_overhead's smoke sizes back, ``fo.smoke_size``).
#: forward_overhead.py runs as users run it, and must: its compiled arms leave dynamo's
#: cache entries on transformers' code objects, which later compiles in this worker would
#: count against their recompile limits
SMOKE_RUNS = {"forward_overhead.py": (["--smoke", "--no-gloo"], "subprocess"),
              "overhead_breakdown.py": (["--smoke"], "in process"),
              "install_time.py": (["--smoke"], "in process"),
              "cp.py": (["--quick"], "in process")}  # cp.py counts, it times nothing


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("script", sorted(LAST_LINES))
def test_benchmark_runs_and_ends_with_its_ratio_line(
        script: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A short run exits 0, measures every arm (no ``n/a``) and ends with its line.

    The test checks the script, not the figures, each at its smallest size that still runs
    every code path once (``--smoke``; cp.py, which counts and times nothing, ``--quick``):
    forward_overhead and overhead_breakdown one round (each arm timed once) on a 1-layer
    model at sequence 8, forward_overhead's three ``torch.compile`` arms on dynamo's
    ``eager`` backend (a cold inductor compile was two thirds of its CPU; inductor on the
    runtime is checked by ``launch --compile`` on gloo ranks); install_time 2/4/8 layers,
    one install per cell, no warm-up; cp.py sequences of 256 and 128, 2-layer models, one
    thread. Where it runs: :data:`SMOKE_RUNS`."""
    import forward_overhead as fo

    argv, where = SMOKE_RUNS[script]
    sizes = fo.LAYERS, fo.SEQ, fo.CONFIG, fo.COMPILE_BACKEND
    if where == "in process":
        code, out, err = bench_main.run_main(script, argv), *capsys.readouterr()
        assert sizes == (fo.LAYERS, fo.SEQ, fo.CONFIG, fo.COMPILE_BACKEND)  # put back
    else:
        proc = subprocess.run([sys.executable, str(BENCH / script), *argv],
                              capture_output=True, text=True, timeout=300)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, err[-3000:]
    last = out.strip().splitlines()[-1]
    found = re.fullmatch(LAST_LINES[script], last)
    assert found, out[-3000:]
    if script == "cp.py":  # the cp/(g+1) rule: 5/8 for Llama-3.1-8B at cp 8
        assert 0.59 <= float(found.group("ulysses")) <= 0.66, last


def test_instruction_counts_reads_callgrind_dumps_and_skips_without_valgrind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each dump file names its phase (``desc: Trigger: ... dump LABEL``) and its total;
    without valgrind the script says so on its last line and exits 0."""
    import instruction_counts as ic

    (tmp_path / "cg.7.1").write_text("version: 1\ndesc: Trigger: dump hpcodegen.fwd\n"
                                     "events: Ir\nsummary: 1234\n")
    (tmp_path / "cg.7.2").write_text("desc: Trigger: dump hf_local.fwd_bwd\ntotals: 99\n")
    (tmp_path / "cg.7").write_text("desc: Trigger: Program termination\nsummary: 5\n")
    assert ic.read_dumps(tmp_path) == {"hpcodegen.fwd": 1234, "hf_local.fwd_bwd": 99}
    monkeypatch.setattr(ic.shutil, "which", lambda _tool: None)
    monkeypatch.setattr(sys, "argv", ["instruction_counts.py"])
    monkeypatch.delenv(ic._WORKER, raising=False)
    assert ic.main() == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "instruction_counts: skipped: valgrind, callgrind_control not installed"
