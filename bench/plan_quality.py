"""Plans against Megatron's first-principles layout, on the published shapes of models people
train (``bench/configs/<model>/config.json``, written from the published numbers).

Per model and setting (tp = 8, or the largest power of two the query and key/value heads
divide; with and without ``--sp``; MoE models also with ``--ep 8``): ``generate`` in
process, then ``inspect-plan``'s bytes per rank (batch 1, seq 8192, bf16, forward plus
backward) and the plan's parameter bytes per rank, each divided by Megatron's
(:mod:`hpcodegen.plan.megatron`; bench/README.md states the formula). A plan ``generate``
keeps above Megatron's layout for a reason it prints (``plan above Megatron``) is listed
as explained; the worst ratios are over the others. A refused setting is listed with its
reason. Last line::

    plan_quality: worst_comm_ratio=... worst_param_ratio=... families=N

Run: ``.venv/bin/python bench/plan_quality.py [--models a,b] [--seq 8192] [--no-ep]
[--configs DIR]`` (``DIR/<model>/config.json``: other shapes through the same comparison).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIGS = Path(__file__).resolve().parent / "configs"
sys.path.insert(0, str(REPO))

ELEM = 2  # bf16


@dataclass
class Row:
    model: str
    setting: str
    comm: float | None = None
    param: float | None = None
    note: str = ""


def largest_tp(config: dict[str, Any], limit: int = 8) -> int:
    """8, or the largest power of two the query and key/value heads both divide."""
    from hpcodegen.plan.tp_divisible import config_size

    heads = (config_size(config, "num_attention_heads") or ("", 1))[1]
    kv = (config_size(config, "num_key_value_heads") or ("", heads))[1]
    tp = limit
    while tp > 1 and (heads % tp or kv % tp):
        tp //= 2
    return tp


def settings(config: dict[str, Any], with_ep: bool) -> list[tuple[int, bool, int]]:
    from hpcodegen.plan.moe import expert_count

    tp = largest_tp(config)
    out = [(tp, False, 1), (tp, True, 1)]
    experts = expert_count(config)
    if with_ep and experts and experts % 8 == 0:
        out += [(tp, False, 8), (tp, True, 8)]
    return out


def plan_bytes(meta: dict[str, Any], model_dir: Path, seq: int) -> float:
    """inspect-plan's bytes per rank, forward plus backward (batch 1, bf16)."""
    from hpcodegen.artifact.load import LoadedMeta
    from hpcodegen.inspect.options import InspectOptions
    from hpcodegen.inspect.run import inspect_meta

    opts = InspectOptions(path="", hf_config=str(model_dir), batch=1, seq=seq, dtype="bf16")
    result = inspect_meta(LoadedMeta(meta, model_dir / "codegen_meta.json", model_dir), opts)
    return result.volume["per_forward_bytes"] + result.volume["per_backward_bytes"]


def measure(name: str, model_dir: Path, seq: int, with_ep: bool) -> list[Row]:
    from hpcodegen.errors import HpcodegenError
    from hpcodegen.generate.api import build_bundle
    from hpcodegen.generate.layouts.cost import ABOVE
    from hpcodegen.generate.layouts.megatron_shape import model_shape
    from hpcodegen.hf import build_meta_model, read_hf_config
    from hpcodegen.plan.codec import entries_from_json
    from hpcodegen.plan.megatron import comm_bytes, param_bytes, plan_param_bytes

    config, _ = read_hf_config(model_dir)
    model = build_meta_model(config)
    shape = model_shape(model, config)
    numels = {n: p.numel() for n, p in model.named_parameters()}
    rows = []
    for tp, sp, ep in settings(config, with_ep):
        label = f"tp{tp}{'/sp' if sp else ''}{f'/ep{ep}' if ep > 1 else ''}"
        notes: list[str] = []
        try:
            files = build_bundle(config, tp, sp, None, name, ep=ep, notes=notes)
        except HpcodegenError as exc:
            rows.append(Row(name, label, note="refused: " + exc.findings[0].render()[:300]))
            continue
        meta = json.loads(files["codegen_meta.json"])
        fwd, bwd = comm_bytes(shape, tp, sp, ep, 1, seq, ELEM)
        if tp <= 1:
            rows.append(Row(name, label, note="tp 1: nothing to compare"))
            continue
        comm = plan_bytes(meta, model_dir, seq) / (fwd + bwd)
        param = plan_param_bytes(entries_from_json(meta["param_plan"]), numels, tp, ep, ELEM) \
            / param_bytes(shape, tp, ep, ELEM)
        above = [n for n in notes if n.startswith(ABOVE)]
        rows.append(Row(name, label, comm, param, above[0] if above else ""))
    return rows


def report(rows: list[Row], families: int) -> str:
    width = max(len(r.model) for r in rows)
    lines = [f"{'model':<{width}}  {'setting':<12} {'comm':>6} {'params':>6}  note"]
    for r in rows:
        comm = f"{r.comm:.3f}" if r.comm is not None else "-"
        param = f"{r.param:.3f}" if r.param is not None else "-"
        lines.append(f"{r.model:<{width}}  {r.setting:<12} {comm:>6} {param:>6}  {r.note}")
    quiet = [r for r in rows if r.comm is not None and not r.note]
    worst_comm = max((r.comm for r in quiet), default=float("nan"))
    worst_param = max((r.param for r in quiet), default=float("nan"))
    explained = [r for r in rows if r.note and not r.note.startswith("refused")]
    refused = [r for r in rows if r.note.startswith("refused")]
    lines.append(f"settings: {len(rows)}, quiet plans: {len(quiet)}, explained above "
                 f"Megatron: {len(explained)}, refused: {len(refused)}")
    lines.append(f"plan_quality: worst_comm_ratio={worst_comm:.3f} "
                 f"worst_param_ratio={worst_param:.3f} families={families}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated config dir names")
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--no-ep", action="store_true", help="leave the --ep 8 settings out")
    parser.add_argument("--configs", type=Path, default=CONFIGS,
                        help="a directory of <model>/config.json (default bench/configs)")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n] or sorted(
        p.name for p in args.configs.iterdir() if (p / "config.json").is_file())
    rows: list[Row] = []
    start = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        rows += measure(name, args.configs / name, args.seq, not args.no_ep)
        print(f"[{name}: {time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)
    print(report(rows, len(names)))  # families: the published shapes measured
    print(f"[{time.perf_counter() - start:.0f} s in all]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
