"""Install time of ``parallelize_from_generated`` against torch ``parallelize_module``.

Llama configs of 8, 32 and 64 layers (small hidden size, so memory stays small) at tp=8 on
rank 0 of a fake process group: collectives return at once, so the clock holds only the
framework's own install work (sharding parameters, installing boundaries or hooks). Each
install runs on a freshly built model; the model build and artifact generation are not
timed. The claim to check: install time grows linearly with the layer count.
Run: ``python bench/install_time.py [--quick | --smoke]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

TP = 8
LAYER_COUNTS = (8, 32, 64)
#: ``--smoke``: three layer counts still (the linearity line needs three), a few layers each
SMOKE_LAYER_COUNTS = (2, 4, 8)


def config_for(layers: int) -> dict[str, Any]:
    """Heads and kv heads divisible by tp=8; hidden 64 keeps 64 layers small."""
    return common.tiny_llama_config(layers, hidden=64, heads=8, kv_heads=8, intermediate=128,
                                    vocab=512)


def time_installs(layers: int, mesh: Any, artifact_dir: Path | None, repeats: int
                  ) -> dict[str, list[float]]:
    """Seconds per install, each arm on a fresh model, the arms taking turns."""
    config = config_for(layers)
    times: dict[str, list[float]] = {"parallelize_module": [], "hpcodegen": []}
    for _ in range(repeats):
        model = common.build_model(config)
        seconds, _ = common.time_once(lambda m=model: common.apply_torch_tp(m, mesh, layers))
        times["parallelize_module"].append(seconds)
        if artifact_dir is not None:
            times["hpcodegen"].append(time_hpcodegen_install(config, mesh, artifact_dir))
    return times


def time_hpcodegen_install(config: dict[str, Any], mesh: Any, artifact_dir: Path) -> float:
    """Seconds of one ``parallelize_from_generated`` call on a fresh generated-class model."""
    from hpcodegen.runtime import parallelize_from_generated

    model = common.build_model(config, model_cls=common.generated_model_class(artifact_dir))
    seconds, _ = common.time_once(lambda: parallelize_from_generated(model, mesh, artifact_dir))
    return seconds


def prepare_artifacts(tmp: Path, notes: list[str], counts: tuple[int, ...] = LAYER_COUNTS
                      ) -> dict[int, Path | None]:
    """One tp=8 artifact per layer count (None, with a note, when that is not possible)."""
    missing = common.hpcodegen_runtime_missing()
    if missing is not None:
        notes.append(f"hpcodegen: skipped: {missing}")
        return dict.fromkeys(counts)
    out: dict[int, Path | None] = {}
    for layers in counts:
        config_dir = common.write_config_dir(config_for(layers), tmp / f"model{layers}")
        try:
            out[layers] = common.generate_artifact(config_dir, TP, tmp / f"artifact{layers}")
        except Exception as exc:  # reported; the torch arm still runs
            notes.append(f"hpcodegen: skipped for {layers} layers: generate failed: {exc}")
            out[layers] = None
    return out


def linearity(medians: dict[int, float]) -> tuple[float, float, float]:
    """(seconds per layer, t64/t8, deviation of t32 from the t8-t64 line, relative).

    A linear install has a constant slope, so t32 lies on the line through t8 and t64;
    t64/t8 equals 8 only when the fixed cost is nil, so it is shown next to the slope.
    The three layer counts are ``medians``' keys (``--smoke`` measures smaller ones).
    """
    lo, mid, hi = sorted(medians)
    slope = (medians[hi] - medians[lo]) / (hi - lo)
    predicted_mid = medians[lo] + slope * (mid - lo)
    return slope, medians[hi] / medians[lo], (medians[mid] - predicted_mid) / predicted_mid


def report(results: dict[int, dict[str, list[float]]], args: argparse.Namespace,
           notes: list[str]) -> None:
    stats = {arm: {n: common.summary(t[arm]) for n, t in results.items() if t[arm]}
             for arm in ("hpcodegen", "parallelize_module")}
    hpc, pm = stats["hpcodegen"], stats["parallelize_module"]
    print(f"model: Llama, hidden 64, 8 heads / 8 kv heads, fp32, tp={TP} on the fake "
          f"process group (rank 0 of 8); {common.machine_note()}")
    print(f"{args.repeats} installs per cell, each on a fresh model, after "
          f"{'no' if args.smoke else 'one'} warm-up install per arm; seconds, median (and min)")
    for note in dict.fromkeys(notes):
        print(note)
    counts = sorted(results)
    rows = [[n, _get(hpc, n, "median"), _get(hpc, n, "min"), pm[n]["median"], pm[n]["min"],
             common.ratio(_get(hpc, n, "median"), pm[n]["median"])] for n in counts]
    print()
    print(common.format_table(["layers", "hpcodegen s", "(min)", "parallelize_module s",
                               "(min)", "ratio"], rows))
    print()
    for arm, by_layers in stats.items():
        if len(by_layers) == len(counts):
            lo, mid, hi = counts
            slope, grow, dev = linearity({n: v["min"] for n, v in by_layers.items()})
            print(f"{arm + ' (min):':26} {slope * 1e3:.2f} ms/layer; t{hi}/t{lo} = {grow:.2f} "
                  f"({hi / lo:.2f} with no fixed cost); t{mid} off the t{lo}-t{hi} line by "
                  f"{dev:+.1%} ({linear_word(dev)})")
    top = counts[-1]  # 64, or --smoke's largest
    s_top = _get(hpc, top, "median")
    print(f"install_time: s_{top}_layers={'n/a' if s_top is None else f'{s_top:.3f}'} "
          f"vs_parallelize_module={common.ratio(s_top, pm[top]['median'])}")


def _get(stats: dict[int, dict[str, float]], layers: int, key: str) -> float | None:
    return stats[layers][key] if layers in stats else None


def linear_word(deviation: float) -> str:
    return "linear" if abs(deviation) <= 0.20 else "NOT linear"


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one install per cell")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script, not the figures: one install per cell on "
                             f"{'/'.join(map(str, SMOKE_LAYER_COUNTS))}-layer models, no "
                             "warm-up install (tests/bench)")
    args = parser.parse_args(argv)
    args.repeats = 1 if args.quick or args.smoke else 15
    counts = SMOKE_LAYER_COUNTS if args.smoke else LAYER_COUNTS
    torch.set_num_threads(1)
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hpcg-install-") as tmp_name:
        artifacts = prepare_artifacts(Path(tmp_name), notes, counts)
        mesh = common.init_fake_pg(TP, rank=0)
        try:
            if not args.smoke:  # a warm-up install per arm (a smoke run times nothing)
                time_installs(counts[0], mesh, artifacts[counts[0]], 1)
            results = {n: time_installs(n, mesh, artifacts[n], args.repeats) for n in counts}
        finally:
            common.destroy_pg()
    report(results, args, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
