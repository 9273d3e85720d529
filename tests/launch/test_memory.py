"""launch's memory check: the estimate by option, the refusal's figures, what is read from
the machine (cgroup, /proc/vmstat), and a killed rank's likely cause. Pure: no rank runs
here (tests/launch/test_memory_refusal.py runs the refusal end to end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcodegen.launch.launcher.verdict import likely_cause
from hpcodegen.launch.rank.memory import (
    HINT,
    JobShape,
    MemoryNeed,
    cgroup_headroom,
    check,
    estimate,
    oom_kills,
)

F, S = 1_000_000, 500_000  # parameters: whole model, one tp=2 rank's


def job(**kw) -> JobShape:
    base = dict(full_numel=F, local_numel=S, dtype_bytes=4, seeded=False, parity=False,
                steps=0, logits_numel=0, accelerator=False)
    return JobShape(**{**base, **kw})


def test_forward_only_from_weights_holds_the_shard() -> None:
    need = estimate(job())
    assert need == MemoryNeed(device=4 * S, host=0, parts=(("sharded parameters", 4 * S),
                                                          ("logits", 0)))


def test_parity_and_steps_add_the_reference_gradients_and_adamw() -> None:
    need = estimate(job(parity=True, steps=3))
    assert need.device == 4 * (4 * S + 4 * F)  # params, grads, two moments: both models
    assert dict(need.parts) == {"sharded parameters": 4 * S, "unsharded reference": 4 * F,
                                "gradients": 4 * (S + F), "AdamW state": 8 * (S + F),
                                "logits": 0}
    assert estimate(job(parity=True)).device == 2 * 4 * (S + F)  # the backward's grads
    assert estimate(job(steps=1)).device == 4 * 4 * S


def test_bf16_halves_the_state_and_logits_count_per_model() -> None:
    assert estimate(job(dtype_bytes=2, steps=1)).device == 2 * 4 * S
    need = estimate(job(parity=True, logits_numel=1000))
    assert dict(need.parts)["logits"] == 2 * 12 * 1000


def test_a_seeded_build_peaks_on_the_whole_float32_model() -> None:
    """No weights: the whole model is built in float32 before it is sharded."""
    need = estimate(job(seeded=True, dtype_bytes=2))
    assert need.device == 4 * F and need.host == 0
    assert need.parts == (("building the sharded model (float32, whole)", 4 * F),)
    gpu = estimate(job(seeded=True, dtype_bytes=2, accelerator=True))
    assert gpu.device == 2 * F and gpu.host == 4 * F  # moved whole to the device, then cut


def test_check_multiplies_host_need_by_the_node_ranks() -> None:
    need = estimate(job(parity=True, steps=1))  # 4*(4S+4F) = 24 MB
    assert check(need, 2, (10**9, "MemAvailable"), None) is None
    refusal = check(need, 2, (30 * 10**6, "MemAvailable"), None)
    assert refusal is not None
    assert "2 rank(s) on this node need" in refusal and "(MemAvailable)" in refusal
    assert "unsharded reference" in refusal and "AdamW state" in refusal


def test_check_on_a_device_compares_its_free_memory_and_the_host_init() -> None:
    need = MemoryNeed(device=8 * 2**30, host=4 * 2**30, parts=(("sharded parameters", 1),))
    free_dev = (6 * 2**30, "cuda mem_get_info: 6.0 GiB of 80.0 GiB free")
    refusal = check(need, 8, (10**12, "MemAvailable"), free_dev)
    assert refusal is not None and "8.0 GiB of device memory" in refusal
    assert "6.0 GiB is free on its device" in refusal
    refusal = check(need, 8, (16 * 2**30, "MemAvailable"), (10**12, "x"))
    assert refusal is not None and "8 rank(s) on this node need 32.0 GiB" in refusal
    assert check(need, 2, (16 * 2**30, "MemAvailable"), (10**12, "x")) is None


def test_the_hint_names_what_lowers_the_need() -> None:
    for option in ("--check-parity", "--dtype bf16", "safetensors", "more tp"):
        assert option in HINT


def test_cgroup_headroom_reads_v2_then_v1(tmp_path: Path) -> None:
    assert cgroup_headroom(tmp_path) is None  # nothing readable: no limit known
    (tmp_path / "memory.max").write_text("max\n")  # v2 without a limit
    (tmp_path / "memory.current").write_text("100\n")
    assert cgroup_headroom(tmp_path) is None
    (tmp_path / "memory.max").write_text("1000\n")
    assert cgroup_headroom(tmp_path) == 900
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # none
    (v1 / "memory" / "memory.usage_in_bytes").write_text("5\n")
    assert cgroup_headroom(v1) is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text("50\n")
    assert cgroup_headroom(v1) == 45


@pytest.mark.skipif(not Path("/proc/vmstat").exists(), reason="Linux /proc/vmstat")
def test_oom_kills_is_the_kernels_counter() -> None:
    line = next((ln for ln in Path("/proc/vmstat").read_text().splitlines()
                 if ln.startswith("oom_kill ")), None)
    assert oom_kills() == (int(line.split()[1]) if line else None)


def test_likely_cause_of_a_signal() -> None:
    assert "OOM killer killed 2 process(es)" in likely_cause("SIGKILL", 2)
    assert "counted no OOM kill" in likely_cause("SIGKILL", 0)
    assert likely_cause("SIGKILL", None).startswith("out of memory")
    assert "crash in native code" in likely_cause("SIGSEGV", None)
    assert "/dev/shm" in likely_cause("SIGBUS", 0)


def test_activations_count_per_layer_and_scores_per_head() -> None:
    from hpcodegen.launch.rank.memory import ActivationShape, activation_bytes

    shape = ActivationShape(rows=2, length=32, hidden=64, intermediate=128, heads=4, layers=3)
    tokens = 2 * 32
    per_layer = tokens * (9 * 64 + 2 * 128) + 2.5 * 2 * 4 * 32 * 32
    assert activation_bytes(shape, 4) == int(per_layer * 3 * 4)
    assert activation_bytes(shape, 2, backward=False) == int(per_layer * 2)  # one layer
    # the score term grows with the square of the length
    longer = ActivationShape(2, 64, 64, 128, 4, 3)
    assert activation_bytes(longer, 4) - 2 * activation_bytes(shape, 4) == int(
        2.5 * 2 * 4 * (64 * 64 - 2 * 32 * 32) * 3 * 4)


def test_activations_join_the_steady_peak_and_the_refusal() -> None:
    act = 10 * 2**30
    need = estimate(job(parity=True, activations=act, tp=2))
    assert dict(need.parts)["activations"] == act // 2 + act  # the shard's / tp + the whole
    assert need.device == 2 * 4 * (S + F) + act // 2 + act
    refusal = check(need, 2, (8 * 2**30, "MemAvailable"), None)
    assert refusal is not None and "activations 15.0 GiB" in refusal
    assert check(estimate(job(parity=True)), 2, (8 * 2**30, "MemAvailable"), None) is None


def test_peak_rss_is_this_process_high_water_mark() -> None:
    from hpcodegen.launch.rank.memory import peak_rss

    before = peak_rss()
    assert before is not None and before > 10 * 2**20  # a python with pytest loaded
    blob = bytearray(64 * 2**20)
    blob[::4096] = b"x" * len(blob[::4096])  # touch every page
    assert peak_rss() >= before and peak_rss() >= 64 * 2**20
    del blob
