"""Pipeline parallelism: bubbles of the frozen schedules, stage balance, p2p bytes.

Three measurements of what ``generate --pp`` freezes and ``inspect-plan`` predicts:

1. **bubbles**: the idle share of ``pp x makespan`` of hpcodegen's own action lists
   (:mod:`hpcodegen.plan.schedule`), simulated with F=1, B=2, I=W=1 and free comms
   (:mod:`hpcodegen.plan.schedule_sim`), side by side with torch 2.13's order for the same
   schedule (``get_schedule_ops``, its sends and receives added by the same lockstep rule,
   then the same simulator): equal where torch's list is valid; torch's 1F1B list
   deadlocks (its last rank runs microbatch ``m`` and never 0), which the table shows.
   The closed form ``(p-1)/(m+p-1)`` is printed beside GPipe and 1F1B.
2. **stage balance**: max over mean of the per-stage parameter counts of the default split
   (balanced by parameter count, embedding and head counted) for the Llama-3.1-8B shape at
   pp 4, read off the meta-device model as generate does; an equal-layers split (8 layers
   per stage, the embedding on the first and the head on the last) is printed beside it.
3. **p2p bytes vs formula**: ``inspect-plan``'s bytes per microbatch per boundary (forward
   and backward) divided by ``b x s x h x dtype bytes`` for the 8B shape at pp 4, m 8,
   b 8, s 4096, bf16 (1.0 = exactly the formula).

DualPipeV's list is torch's order with each overlapped ``F B`` pair as its two halves
(what torch's runtime runs); with these unit costs its bubble equals ZBV's.

Run: ``python bench/pp.py``; the last line is ``pp: bubble_1f1b_p4m8=...
bubble_interleaved_p4m8=... bubble_zbv_p4m8=... stage_param_balance_llama8b_pp4=...
p2p_bytes_vs_formula=... bubble_dualpipev_p4m8=...``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
SHAPES = ((4, 8), (4, 16), (8, 16), (8, 32))
SCHEDULES = (("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2),
             ("DualPipeV", 2))


def ours(name: str, pp: int, m: int, v: int) -> float:
    from hpcodegen.plan.schedule import build_actions, schedule_spec
    from hpcodegen.plan.schedule_sim import simulate

    spec = schedule_spec(name)
    sim = simulate(build_actions(name, pp, m, v), pp=pp, n_stages=pp * v, n_microbatches=m,
                   style=spec.style)
    assert sim.ok, sim.problems[:1]
    return sim.bubble


def torchs(name: str, pp: int, m: int, v: int) -> str:
    """torch's order through our comm insertion and simulator: the bubble, or why not."""
    try:
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    except ImportError:
        return "n/a"
    from hpcodegen.plan.schedule import add_comms, expand_action, schedule_spec
    from hpcodegen.plan.schedule_sim import simulate

    spec = schedule_spec(name)
    ops = get_schedule_ops(name, pp, m, v if v > 1 else None, with_comms=False)
    compute = {r: [x for a in row if a is not None and "REDUCE" not in str(a)
                   for x in expand_action(str(a))] for r, row in enumerate(ops)}
    try:
        acts = add_comms(compute, pp, spec.style)
    except ValueError:
        return "deadlock"
    sim = simulate(acts, pp=pp, n_stages=pp * v, n_microbatches=m, style=spec.style)
    return f"{sim.bubble:.3f}" if sim.ok else f"invalid ({sim.problems[0].code})"


def balance() -> tuple[float, float]:
    """(default split max/mean, layers-only split max/mean) for Llama-3.1-8B at pp 4."""
    from hpcodegen.generate.layouts.pipeline import model_units
    from hpcodegen.hf import build_meta_model
    from hpcodegen.plan.pipeline_build import split_units, stage_param_counts

    config = json.loads((ROOT / "configs" / "llama-3.1-8b" / "config.json").read_text())
    units, _replicated, _base = model_units(build_meta_model(config))
    layers = sum(u.is_layer for u in units)
    out = []
    for layout in (None, [layers // 4] * 4):
        counts = stage_param_counts(units, split_units(units, 4, layout))
        out.append(max(counts) / (sum(counts) / len(counts)))
    return out[0], out[1]


def p2p_ratio() -> float:
    """inspect-plan's p2p bytes per microbatch over b*s*h*2 for the 8B shape, pp 4 m 8."""
    from hpcodegen.inspect.pipeline import pipeline_report
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.plan.pipeline_build import Unit, build_pipeline

    config = json.loads((ROOT / "configs" / "llama-3.1-8b" / "config.json").read_text())
    layers = config["num_hidden_layers"]
    units = ([Unit("model.embed_tokens", 1, False)]
             + [Unit(f"model.layers.{i}", 1, True) for i in range(layers)]
             + [Unit("model.norm", 1, False), Unit("lm_head", 1, False)])
    section = build_pipeline(units, pp=4, schedule="1F1B", n_microbatches=8)
    plan = plan_from_meta({"parallel_dims": {"pp_size": 4, "tp_size": 1}, "pipeline": section})
    b, s, h = 8, 4096, config["hidden_size"]
    report = pipeline_report(plan, config=config, batch=b, seq=s, element_bytes=2)
    formula = (b // 8) * s * h * 2
    ratios = [st[k] / formula for st in report["stages"]
              for k in ("p2p_forward_bytes_per_microbatch", "p2p_backward_bytes_per_microbatch")
              if st[k]]
    return max(ratios, key=lambda r: abs(r - 1.0))


def main() -> int:
    sys.path.insert(0, str(ROOT.parent))
    rows: list[list[Any]] = []
    for name, v in SCHEDULES:
        for pp, m in SHAPES:
            closed = f"{(pp - 1) / (m + pp - 1):.3f}" if v == 1 else "-"
            rows.append([name, v, pp, m, f"{ours(name, pp, m, v):.3f}", torchs(name, pp, m, v),
                         closed])
    print(f"{'schedule':<16} {'v':>2} {'pp':>3} {'m':>3} {'ours':>7} {'torch 2.13':>18} "
          f"{'(p-1)/(m+p-1)':>14}")
    for r in rows:
        print(f"{r[0]:<16} {r[1]:>2} {r[2]:>3} {r[3]:>3} {r[4]:>7} {r[5]:>18} {r[6]:>14}")
    default, layers_only = balance()
    print(f"Llama-3.1-8B pp4 stage parameters max/mean: default split {default:.3f}, "
          f"equal-layers split {layers_only:.3f}")
    ratio = p2p_ratio()
    print(f"p2p bytes per microbatch (inspect-plan) / (b*s*h*2): {ratio:.4f}")
    print(f"pp: bubble_1f1b_p4m8={ours('1F1B', 4, 8, 1):.3f} "
          f"bubble_interleaved_p4m8={ours('Interleaved1F1B', 4, 8, 2):.3f} "
          f"bubble_zbv_p4m8={ours('ZBVZeroBubble', 4, 8, 2):.3f} "
          f"stage_param_balance_llama8b_pp4={default:.3f} p2p_bytes_vs_formula={ratio:.3f} "
          f"bubble_dualpipev_p4m8={ours('DualPipeV', 4, 8, 2):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
