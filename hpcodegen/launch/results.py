"""Per-rank state files: each rank's progress and then its result, one JSON file per rank.

A rank rewrites ``<run_dir>/rank<N>.json`` atomically (write a temp file, ``os.replace``)
whenever its phase changes, so the launcher can poll the directory at any moment and never
read half a file. The launcher trusts these files, not torchrun's exit code (which is 1 for
any failure): a rank that died without writing its final state shows as ``lost``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcodegen.atomic import write_atomic

#: Terminal statuses; ``error`` means the rank raised (the launcher ends the job at once),
#: ``fail`` means it ran but a check (parity) did not pass.
STATUS_RUNNING = "running"
STATUS_OK = "ok"
STATUS_FAIL = "fail"
STATUS_ERROR = "error"
STATUS_LOST = "lost"
STATUS_ENDED = "ended"
#: set by the launcher: the rank died of a signal it did not send (the kernel's OOM killer)
STATUS_KILLED = "killed"
#: the rank's memory check found the job cannot fit; nothing was built (exit 2)
STATUS_REFUSED = "refused"
TERMINAL = frozenset({STATUS_OK, STATUS_FAIL, STATUS_ERROR, STATUS_REFUSED})


@dataclass(kw_only=True)
class RankRecord:
    """What one rank reports; also the progress record while it runs.

    Attributes:
        rank / local_rank / world_size: torchrun's numbering.
        host / pid: where the rank runs (the launcher uses ``pid`` to clean up).
        device: e.g. ``cpu`` or ``cuda:1``.
        status: running, ok, fail, error, refused (its memory check); set by the launcher:
            ``lost`` (the rank ended without a final state), ``killed`` (a signal the
            launcher did not send ended it) or ``ended`` (the launcher ended it: another
            rank failed, or the timeout passed).
        phase: what the rank is doing (``init``, ``build``, ``parallelize``, ``step 2/3``...).
        error: ``Type: message`` of the exception that ended the rank.
        traceback: for a user script, the tail of the script's own traceback.
        weights: where the model's weights came from (safetensors files or a seeded init).
        local_param_bytes: bytes of the parameters this rank holds after sharding.
        forward_ms: wall time of one sharded forward (under ``--compile`` a warm one of the
            graph the job runs: compile time is not in it).
        parity: ``{"logits_max_diff", "grad_max_diff", "worst_grad", "tolerance", ...}``.
        losses: per-step losses; ``ref_losses`` the unsharded model's with --check-parity.
        batch: the smoke batch: ``{"rows", "length", "window", "cap", "window_exercised",
            "note"}`` (``note`` says why the config's sliding window was not exercised).
        peak_rss_bytes: the rank process's peak resident memory so far (its own high-water
            mark, updated with every record).
        started / updated: unix times.
    """

    rank: int
    local_rank: int = 0
    world_size: int = 1
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    device: str = ""
    status: str = STATUS_RUNNING
    phase: str = "start"
    error: str | None = None
    traceback: list[str] | None = None
    weights: str | None = None
    local_param_bytes: int | None = None
    forward_ms: float | None = None
    parity: dict[str, Any] | None = None
    losses: list[float] = field(default_factory=list)
    ref_losses: list[float] = field(default_factory=list)
    batch: dict[str, Any] | None = None
    peak_rss_bytes: int | None = None
    started: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def record_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.json"


def write_record(run_dir: Path, record: RankRecord) -> None:
    """Atomically replace this rank's file (readers see the old or the new one, whole)."""
    record.updated = time.time()
    target = record_path(run_dir, record.rank)
    write_atomic(target, lambda fh: json.dump(record.to_json(), fh, allow_nan=True))


def _from_json(data: dict[str, Any]) -> RankRecord | None:
    known = RankRecord.__dataclass_fields__
    try:
        return RankRecord(**{k: v for k, v in data.items() if k in known})
    except TypeError:
        return None


def read_records(run_dir: Path) -> dict[int, RankRecord]:
    """Every readable rank file in ``run_dir``, by rank (unreadable files are skipped)."""
    out: dict[int, RankRecord] = {}
    for path in sorted(Path(run_dir).glob("rank*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        record = _from_json(data) if isinstance(data, dict) else None
        if record is not None:
            out[record.rank] = record
    return out


def first_error(records: dict[int, RankRecord]) -> RankRecord | None:
    """The rank that failed first (the root cause; the others usually failed because of it)."""
    errors = [r for r in records.values() if r.status == STATUS_ERROR]
    return min(errors, key=lambda r: (r.updated, r.rank)) if errors else None
