"""Instructions per call of the hpcodegen runtime against the HF local-shape floor (fake PG).

Why: on the shared 2-core machine the wall-clock ratios of ``forward_overhead.py`` move by
5-10% from run to run, and even with the arms interleaved, which arm was built first moves
them by a few percent. The instruction count that valgrind's callgrind reports is the same
from run to run, so a change of a few tenths of a percent shows. It is not a time: cache
misses are not counted, and the wall-clock ratio of the same arms is higher (see
bench/README.md, "Issue 14").

The arms and batch are ``forward_overhead.py``'s (tiny Llama, tp=2, rank 0 of a fake process
group): the hpcodegen runtime, the hand-written Megatron forward and transformers' model at
the local shapes with no collectives (the floor). The script runs itself again under
``valgrind --tool=callgrind`` (about 5 minutes: torch's import dominates), warms every arm
up, then has callgrind dump its counters after each phase (``callgrind_control --dump``):
``--steps`` forwards under no_grad, then ``--steps`` forward+backward steps, per arm. Last
line: ``instruction_counts: fwd=... fwd_bwd=...`` (hpcodegen over the floor).

Run: ``python bench/instruction_counts.py [--steps N]`` (prints a skip line without valgrind).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

ARMS = ("hpcodegen", "handwritten", "hf_local")
MODES = ("fwd", "fwd_bwd")
_WORKER = "HPCG_CALLGRIND_WORKER"


def worker(steps: int) -> None:
    """Under callgrind: build the arms, warm them up, dump the counters after each phase."""
    import forward_overhead as fo
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="hpcg-icount-") as tmp:
        notes: list[str] = []
        artifact = fo.prepare_artifact(Path(tmp), notes)
        if artifact is None:
            raise SystemExit(f"instruction_counts: no hpcodegen arm: {'; '.join(notes)}")
        mesh = common.init_fake_pg(fo.TP, rank=0)
        ids = fo.batch_ids(fo.CONFIG["vocab_size"])
        arms = {"hpcodegen": (common.build_hpcodegen_model(fo.CONFIG, mesh, artifact), ids),
                "handwritten": (fo.HandwrittenLlama(common.build_model(fo.CONFIG), mesh), ids),
                "hf_local": (fo.local_shape_model(), ids % (fo.CONFIG["vocab_size"] // fo.TP))}
        fns = {name: fo.step_fns(arm, arm_ids) for name, (arm, arm_ids) in arms.items()}
        for forward, forward_backward in fns.values():
            for _ in range(3):
                forward()
                forward_backward()
        dump("setup")
        for index, mode in enumerate(MODES):
            for name in ARMS:
                for _ in range(steps):
                    fns[name][index]()
                dump(f"{name}.{mode}")
        common.destroy_pg()


def dump(label: str) -> None:
    subprocess.run(["callgrind_control", "--dump=" + label, str(os.getpid())], check=True,
                   capture_output=True)


def read_dumps(directory: Path) -> dict[str, int]:
    """``{label: instructions}`` from callgrind's dump files (``desc: Trigger`` + ``summary``)."""
    counts: dict[str, int] = {}
    for path in directory.glob("cg.*"):
        text = path.read_text(errors="replace")
        label = re.search(r"^desc: Trigger: .*?dump\s+(\S+)", text, re.M)
        total = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
        if label and total:
            counts[label.group(1)] = int(total.group(1))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="calls per arm and mode")
    args = parser.parse_args()
    if os.environ.get(_WORKER):
        worker(args.steps)
        return 0
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        print(f"instruction_counts: skipped: {', '.join(missing)} not installed")
        return 0
    with tempfile.TemporaryDirectory(prefix="hpcg-callgrind-") as tmp:
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p",
             sys.executable, __file__, "--steps", str(args.steps)],
            env={**os.environ, _WORKER: "1"}, capture_output=True, text=True)
        counts = read_dumps(Path(tmp))
    wanted = [f"{name}.{mode}" for mode in MODES for name in ARMS]
    if run.returncode != 0 or any(label not in counts for label in wanted):
        tail = "\n".join(run.stderr.strip().splitlines()[-5:])
        print(f"instruction_counts: failed (valgrind exit {run.returncode}):\n{tail}")
        return 1
    per_call = {label: counts[label] / args.steps for label in wanted}

    def over_floor(name: str, mode: str) -> str:  # 3 decimals: the differences are small
        return f"{per_call[f'{name}.{mode}'] / per_call[f'hf_local.{mode}']:.3f}"

    print(f"model: forward_overhead.py's tiny Llama, fake PG rank 0 of 2; instructions per "
          f"call (callgrind), {args.steps} calls per arm and mode")
    rows = [[name, *(f"{per_call[f'{name}.{mode}'] / 1e6:.3f}M" for mode in MODES),
             *(over_floor(name, mode) for mode in MODES)] for name in ARMS]
    print(common.format_table(["arm", "fwd", "fwd+bwd", "fwd / floor", "f+b / floor"], rows))
    print(f"instruction_counts: fwd={over_floor('hpcodegen', 'fwd')} "
          f"fwd_bwd={over_floor('hpcodegen', 'fwd_bwd')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
