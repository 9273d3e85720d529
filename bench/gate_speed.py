"""Is the artifact gate instant? ``verify`` and ``inspect-plan`` against ``import torch``.

Each command runs as a whole process, the way CI and a pre-commit hook run it, on synthetic
artifacts of 30, 1,000 and 10,000 plan entries (``bench/synthetic.py``: a generated example
grown layer by layer, so verify checks it for real). ``python -c "import torch"`` runs the
same way as the yardstick: a gate slower than importing torch is not a gate.

Every command runs once to warm the file cache, then ``--runs`` times; the table shows
medians. The last line is machine-readable::

    gate_speed: verify_1k_s=... inspect_10k_s=... verify_vs_import_torch=...

``verify_vs_import_torch`` is ``import_torch_s / verify_1k_s`` (how many times faster the
gate is than the import alone; the target is >= 10). ``inspect_10k_s`` is the default
``inspect-plan`` (verify's schema and plan checks first); ``inspect_10k_nochecks_s`` the same
with ``--no-checks``.

Usage: ``python bench/gate_speed.py [--runs N] [--sizes 30,1000,10000]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic import write_synthetic

PY = sys.executable
IMPORT_TORCH = [PY, "-c", "import torch"]


def commands(artifact: Path) -> dict[str, list[str]]:
    """The timed commands for one artifact, by column name."""
    cli = [PY, "-m", "hpcodegen"]
    return {
        "verify": [*cli, "verify", str(artifact)],
        "inspect-plan": [*cli, "inspect-plan", str(artifact)],
        "inspect --no-checks": [*cli, "inspect-plan", "--no-checks", str(artifact)],
    }


def time_once(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        print(f"  warning: {' '.join(argv[2:4])} exited {proc.returncode}: {' | '.join(tail)}",
              file=sys.stderr)
    return elapsed, proc.returncode


def median_time(argv: list[str], runs: int) -> tuple[float, int]:
    """Median wall time over ``runs`` after one warm-up run; and the exit code seen."""
    _, code = time_once(argv)
    times = [time_once(argv)[0] for _ in range(runs)]
    return statistics.median(times), code


def measure(sizes: list[int], runs: int, workdir: Path) -> tuple[dict, float]:
    results: dict[int, dict[str, tuple[float, int]]] = {}
    for n in sizes:
        artifact = write_synthetic(workdir / f"meta_{n}", n)
        results[n] = {name: median_time(argv, runs) for name, argv in commands(artifact).items()}
        print(f"  measured {n} entries", file=sys.stderr, flush=True)
    torch_s, _ = median_time(IMPORT_TORCH, runs)
    return results, torch_s


def print_table(results: dict, torch_s: float) -> None:
    cols = list(next(iter(results.values())))
    head = f"{'entries':>8} | " + " | ".join(f"{c:>20}" for c in cols)
    print(head)
    print("-" * len(head))
    for n, row in results.items():
        cells = [f"{t:8.3f} s (exit {code})" for t, code in row.values()]
        print(f"{n:>8} | " + " | ".join(f"{c:>20}" for c in cells))
    print(f"{'':>8}   python -c 'import torch': {torch_s:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command (median)")
    parser.add_argument("--sizes", default="30,1000,10000", help="plan entries per artifact")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="gate_speed_") as tmp:
        results, torch_s = measure(sizes, args.runs, Path(tmp))
    print_table(results, torch_s)
    verify_1k = results.get(1000, {}).get("verify", (float("nan"), 0))[0]
    inspect_10k = results.get(10000, {}).get("inspect-plan", (float("nan"), 0))[0]
    inspect_10k_nc = results.get(10000, {}).get("inspect --no-checks", (float("nan"), 0))[0]
    ratio = torch_s / verify_1k if verify_1k == verify_1k and verify_1k > 0 else float("nan")
    print(f"gate_speed: verify_1k_s={verify_1k:.3f} inspect_10k_s={inspect_10k:.3f} "
          f"verify_vs_import_torch={ratio:.2f} inspect_10k_nochecks_s={inspect_10k_nc:.3f} "
          f"import_torch_s={torch_s:.3f}", flush=True)


if __name__ == "__main__":
    main()
