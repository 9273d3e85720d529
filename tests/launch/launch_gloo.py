"""Launch's rank job on the session's kept gloo ranks, for the launch tests whose subject is
the numbers a rank reports (exactness against the unsharded model, the smoke batch, a
checkpoint's contents), not the launching.

Every launch feature keeps a real ``hpcodegen launch`` in its own test (torchrun, the
launcher's model check and verdict, one fresh process per rank): ``--check-parity``
(``test_parity.py``), ``--save`` (``test_checkpoints.py``), ``--resume`` at another mesh,
``--compile``, faults, blame, timeouts, a family's default sliding window. The cases run
here (bf16, twenty steps with sequence parallelism, the save that a real ``--resume``
reads, three AdamW steps of the example, the loss-parallel artifact, the other families'
sliding windows) run the same rank job (:func:`hpcodegen.launch.rank.smoke.run`) with the
environment the launcher gives each rank (:func:`hpcodegen.launch.launcher.command.
job_environment`, after the options' own check) on real gloo ranks forked from a preloaded
parent: same code, same numbers, without a launcher, a torchrun and two fresh interpreters
importing torch and transformers per case. A module fixture runs its module's cases in one
call; each test asserts its own case and :func:`ok_doc` fails naming it.

The definitions are ``tests/launching.py``'s, shared with tests/pp and tests/cp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launching import gloo_launch, ok_doc, rank_env, smoke_cases

__all__ = ["fresh_peak_cases", "gloo_launch", "ok_doc", "rank_env"]

#: the kernel's per-process switch that resets the peak resident memory (``VmHWM``) to the
#: current resident memory (proc(5), ``clear_refs``, value 5; Linux 4.0 and later)
CLEAR_REFS = Path("/proc/self/clear_refs")


def fresh_peak_cases(cases: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
    """:func:`launching.smoke_cases`, one case at a time, each rank's peak resident memory
    reset to its current one before each case, so a record's ``peak_rss_bytes`` is the
    case's own peak on top of what the rank holds (torch and transformers imported, as in
    a fresh launched rank), not the high-water mark of whatever the kept rank ran before.
    Each case's record also gets ``rss_at_start_bytes`` (what the rank held at the reset),
    for a failing bound's message. Refuses to run where the reset is not available: a peak
    that could not be reset would not be the case's."""
    out: dict[str, Any] = {}
    for case in cases:
        CLEAR_REFS.write_text("5")
        start = _rss_bytes()
        result = smoke_cases([case])
        result[case[0]]["record"]["rss_at_start_bytes"] = start
        out.update(result)
    return out


def _rss_bytes() -> int:
    """This process's resident memory now (``/proc/self/status`` ``VmRSS``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            return int(value) * (1024 if unit.lower() == "kb" else 1)
    raise AssertionError("/proc/self/status has no VmRSS line")
