"""Is the artifact gate instant? ``verify`` and ``inspect-plan`` against ``import torch``.

Each command runs as a whole process, the way CI and a pre-commit hook run it, on synthetic
artifacts of 30, 1,000 and 10,000 plan entries (``bench/synthetic.py``: a generated example
grown layer by layer, so verify checks it for real). ``python -c "import torch"`` runs the
same way as the yardstick: a gate slower than importing torch is not a gate.

Every command runs once to warm the file cache, then ``--runs`` times; the table shows
medians. The last line is machine-readable::

    gate_speed: verify_1k_s=... inspect_10k_s=... verify_vs_import_torch=...

``verify_10k_s`` is ``verify`` of the 10,000-entry artifact. ``derive_1k_s`` and
``derive_10k_s`` are one run each of ``verify --hf-config`` (the model check included: the
derivation of every placement by DTensor propagation on a fake process group) on an
artifact of about that many entries cut to whole layers, with a Llama config of as many
layers; a run that does not pass prints ``refused`` instead of a time (``--no-derive``
skips them).

``verify_vs_import_torch`` is ``import_torch_s / verify_1k_s`` (how many times faster the
gate is than the import alone; the target is >= 10). ``inspect_10k_s`` is the default
``inspect-plan`` (verify's schema and plan checks first); ``inspect_10k_nochecks_s`` the same
with ``--no-checks``.

Usage: ``python bench/gate_speed.py [--runs N] [--sizes 30,1000,10000]``
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic import TEMPLATE, whole_layer_entries, write_synthetic

PY = sys.executable
IMPORT_TORCH = [PY, "-c", "import torch"]
#: The children may cache bytecode, as every installed package (torch included) has it
#: cached: with ``PYTHONDONTWRITEBYTECODE`` set (some CI and sandboxes set it) an editable
#: hpcodegen was recompiled from source on every timed run (~0.05 s of its 0.3 s), while
#: torch's ``.pyc`` files came with its wheel. The warm-up run writes the cache.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def commands(artifact: Path) -> dict[str, list[str]]:
    """The timed commands for one artifact, by column name."""
    cli = [PY, "-m", "hpcodegen"]
    return {
        "verify": [*cli, "verify", str(artifact)],
        "inspect-plan": [*cli, "inspect-plan", str(artifact)],
        "inspect --no-checks": [*cli, "inspect-plan", "--no-checks", str(artifact)],
    }


@dataclass(frozen=True)
class Timing:
    """Medians over the timed runs: wall clock, and CPU (user+sys) of the child process."""

    wall: float
    cpu: float
    code: int


def time_once(argv: list[str]) -> tuple[float, float, int]:
    """Wall and CPU seconds of one run (CPU from the children's rusage delta)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False,
                          env=CHILD_ENV)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        print(f"  warning: {' '.join(argv[2:4])} exited {proc.returncode}: {' | '.join(tail)}",
              file=sys.stderr)
    return elapsed, cpu, proc.returncode


def median_time(argv: list[str], runs: int) -> Timing:
    """Medians over ``runs`` after one warm-up run; and the exit code seen.

    The CPU time hardly depends on other load on the machine; the wall time does.
    """
    code = time_once(argv)[2]
    samples = [time_once(argv) for _ in range(runs)]
    return Timing(statistics.median(s[0] for s in samples),
                  statistics.median(s[1] for s in samples), code)


def measure(sizes: list[int], runs: int, workdir: Path) -> tuple[dict[int, dict[str, Timing]],
                                                                  Timing]:
    results: dict[int, dict[str, Timing]] = {}
    for n in sizes:
        artifact = write_synthetic(workdir / f"meta_{n}", n)
        results[n] = {name: median_time(argv, runs) for name, argv in commands(artifact).items()}
        print(f"  measured {n} entries", file=sys.stderr, flush=True)
    return results, median_time(IMPORT_TORCH, runs)


LLAMA_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "configs" / "llama"


def measure_derive(n: int, workdir: Path) -> str:
    """Seconds of one ``verify --hf-config`` on ``~n`` whole-layer entries, or ``refused``."""
    import json

    artifact = write_synthetic(workdir / f"derive_{n}", whole_layer_entries(n, TEMPLATE))
    meta = json.loads((artifact / "codegen_meta.json").read_text())
    config = json.loads((LLAMA_CONFIG / "config.json").read_text())
    config["num_hidden_layers"] = meta["source"]["structure"]["num_hidden_layers"]
    cfg_dir = workdir / f"derive_{n}_config"
    cfg_dir.mkdir()
    (cfg_dir / "config.json").write_text(json.dumps(config))
    wall, _cpu, code = time_once([PY, "-m", "hpcodegen", "verify", str(artifact),
                                  "--hf-config", str(cfg_dir)])
    print(f"  derived {len(meta['param_plan'])} entries "
          f"({config['num_hidden_layers']} layers): exit {code}", file=sys.stderr, flush=True)
    return f"{wall:.3f}" if code == 0 else "refused"


def print_table(results: dict[int, dict[str, Timing]], torch: Timing) -> None:
    cols = list(next(iter(results.values())))
    head = f"{'entries':>8} | " + " | ".join(f"{c + ' wall/cpu s':>26}" for c in cols)
    print(head)
    print("-" * len(head))
    for n, row in results.items():
        cells = [f"{t.wall:7.3f} / {t.cpu:6.3f} (exit {t.code})" for t in row.values()]
        print(f"{n:>8} | " + " | ".join(f"{c:>26}" for c in cells))
    print(f"{'':>8}   python -c 'import torch': {torch.wall:.3f} s wall, {torch.cpu:.3f} s cpu")
    print(f"{'':>8}   load average at the end: {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores (wall times grow with it, CPU times hardly)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command (median)")
    parser.add_argument("--sizes", default="30,1000,10000", help="plan entries per artifact")
    parser.add_argument("--no-derive", action="store_true",
                        help="skip the --hf-config runs (derive_1k_s, derive_10k_s)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="gate_speed_") as tmp:
        results, torch = measure(sizes, args.runs, Path(tmp))
        derive = {n: "skipped" if args.no_derive else measure_derive(n, Path(tmp))
                  for n in (1000, 10000)}
    print_table(results, torch)
    missing = Timing(float("nan"), float("nan"), -1)
    verify_1k = results.get(1000, {}).get("verify", missing)
    verify_10k = results.get(10000, {}).get("verify", missing)
    inspect_10k = results.get(10000, {}).get("inspect-plan", missing)
    inspect_10k_nc = results.get(10000, {}).get("inspect --no-checks", missing)
    ratio = torch.wall / verify_1k.wall if verify_1k.wall > 0 else float("nan")
    print(f"gate_speed: verify_1k_s={verify_1k.wall:.3f} inspect_10k_s={inspect_10k.wall:.3f} "
          f"verify_vs_import_torch={ratio:.2f} inspect_10k_nochecks_s={inspect_10k_nc.wall:.3f} "
          f"import_torch_s={torch.wall:.3f} verify_1k_cpu_s={verify_1k.cpu:.3f} "
          f"inspect_10k_cpu_s={inspect_10k.cpu:.3f} import_torch_cpu_s={torch.cpu:.3f} "
          f"verify_10k_s={verify_10k.wall:.3f} verify_10k_cpu_s={verify_10k.cpu:.3f} "
          f"derive_1k_s={derive[1000]} derive_10k_s={derive[10000]}",
          flush=True)


if __name__ == "__main__":
    main()
