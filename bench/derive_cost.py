"""What the derivation by propagation costs (``verify --hf-config``'s ``derive.*``).

The derivation (:mod:`hpcodegen.derive`) builds the model on the meta device and runs its
forward and backward once on DTensors over a fake process group; its cost grows with the
layer count. This times :func:`hpcodegen.checks.model.derivation_findings` in process on
the synthetic Llama TP+SP artifacts of ``gate_speed.py`` (``bench/synthetic.py``:
entries per layer, whole layers: the size rounded down to them) with the example Llama config
grown to the same layer count, CPU and
wall seconds, once per size (the first size also pays torch's import, reported apart).

Usage: ``python bench/derive_cost.py [--sizes 1000,10000]``; the last line reads
``derive_cost: derive_1k_s=... derive_10k_s=...``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic import write_synthetic

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "llama" / "config.json"


def _whole_layers(n: int) -> bool:
    """Every layer of the synthetic plan of ``n`` entries has as many entries as layer 0."""
    from collections import Counter

    from synthetic import synthetic_plan

    per = Counter(f.split(".")[2] for f in synthetic_plan(n) if f.startswith("model.layers."))
    return len(set(per.values())) <= 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    args = parser.parse_args()
    start = time.process_time()
    import torch  # noqa: F401  (paid once, reported apart)

    from hpcodegen.artifact.load import load_meta
    from hpcodegen.checks.model import derivation_findings
    from hpcodegen.plan.codec import plan_from_meta

    print(f"import torch + hpcodegen: {time.process_time() - start:.2f} s cpu")
    figures = {}
    for size in (int(s) for s in args.sizes.split(",")):
        n = size
        while not _whole_layers(n):  # a half-planned last layer is a plan that runs wrong
            n -= 1
        with tempfile.TemporaryDirectory() as tmp:
            art = write_synthetic(Path(tmp) / "a", n)
            meta = load_meta(art).data
            layers = meta["source"]["structure"]["num_hidden_layers"]
            config = dict(json.loads(CONFIG.read_text()), num_hidden_layers=layers)
            plan = plan_from_meta(meta)
            wall, cpu = time.perf_counter(), time.process_time()
            found = derivation_findings(plan, config, ours=True)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        errors = sorted({f.code for f in found if f.severity.value == "error"})
        summary = next((f.message for f in found if f.code.startswith(
            ("derive.summary", "derive.skipped", "derive.incomplete"))), "")
        print(f"{n:>6} entries ({layers} layers): {wall:7.2f} s wall, {cpu:7.2f} s cpu; "
              f"{summary}; errors: {errors or 'none'}")
        figures[f"derive_{size // 1000}k_s" if size >= 1000 else f"derive_{size}_s"] = \
            round(wall, 2)
    print("derive_cost: " + " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
