"""Where the runtime's cost over the HF floor goes: the same model with parts taken out.

``forward_overhead.py`` measures hpcodegen at 1.05-1.15x the HF local-shape floor (fake PG,
tp 2). This script attributes that gap by timing, side by side in one run, copies of the
hpcodegen model with one piece of the tensor-parallel machinery replaced:

* ``no_f``: Megatron's f (each tp region's entry: identity forward, all_reduce of the
  gradient) made a plain identity: no autograd node and no backward collective;
* ``f_node_only``: f as an ``autograd.Function`` whose backward returns the gradient as
  it is (the Python node without its collective);
* ``no_f_no_g``: f and g (the row-parallel output's all_reduce) both plain identities;
* ``no_f_g_clone``: f an identity, g only the ``clone`` of its input (no collective).

The variants compute wrong gradients (and ``no_g`` wrong values) on a real group: they are
timing probes, never a runtime mode. Each ratio is over the floor; the difference between
two rows is what the replaced piece costs. Ratios are medians of per-round ratios
(``common.paired_ratio``). The embedding's masked lookup and the logits
gather (wrapped boundaries) stay as they are in every row.

Run: ``python bench/overhead_breakdown.py [--quick | --smoke]`` (``--smoke``: a check of the
script, not the figures: ``forward_overhead.py``'s smoke model, one layer at sequence 8, and
one timed round). Last line:
``overhead_breakdown: hpcodegen=... f_node_only=... no_f=... no_f_g_clone=... no_f_no_g=...``
(forward+backward over the floor).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import forward_overhead as fo

VARIANTS = ("hpcodegen", "f_node_only", "no_f", "no_f_g_clone", "no_f_no_g")


def _identity(x: Any) -> Any:
    return x


def _clone(x: Any) -> Any:
    return x.clone()


def _node_only() -> Any:
    import torch

    class EnterNoComm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad

    def enter(x: Any) -> Any:
        return EnterNoComm.apply(x) if x.requires_grad and torch.is_grad_enabled() else x
    return enter


def build_variant(name: str, mesh: Any, artifact: Path) -> Any:
    """The hpcodegen model with the named piece replaced on every generated boundary."""
    model = common.build_hpcodegen_model(fo.CONFIG, mesh, artifact)
    enter = {"hpcodegen": None, "f_node_only": _node_only(), "no_f": _identity,
             "no_f_g_clone": _identity, "no_f_no_g": _identity}[name]
    leave = {"no_f_g_clone": _clone, "no_f_no_g": _identity}.get(name)
    for module in model.modules():
        ops = module.__dict__.get("_hp_tp")
        if ops is None:
            continue
        if enter is not None:
            ops.to_local = enter
        if leave is not None:
            ops.all_reduce = leave
    return model


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few iterations (development)")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script, not the figures: a 1-layer model, sequence 8, "
                             "one round (tests/bench)")
    parser.add_argument("--rounds", type=int, metavar="N",
                        help="timed rounds (default 200, --quick 30; one warm-up call)")
    args = parser.parse_args(argv)
    warmup, rounds = (3, 30) if args.quick else (10, 200)
    if args.smoke:  # every variant timed once (after interleaved_timings' untimed settle call)
        warmup, rounds = 0, 1
    if args.rounds:  # a run that checks the script, not a measurement (tests/bench)
        warmup, rounds = 1, args.rounds
    torch.set_num_threads(1)
    with fo.smoke_size() if args.smoke else contextlib.nullcontext():
        return run(warmup, rounds)


def run(warmup: int, rounds: int) -> int:
    """Time every variant and the floor at forward_overhead's current size; print the
    report."""
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hpcg-breakdown-") as tmp:
        artifact = fo.prepare_artifact(Path(tmp), notes)
        if artifact is None:
            print("\n".join(notes))
            return 1
        mesh = common.init_fake_pg(fo.TP, rank=0)
        try:
            arms = {name: build_variant(name, mesh, artifact) for name in VARIANTS}
            arms["hf_local"] = fo.local_shape_model()
            ids = fo.batch_ids(fo.CONFIG["vocab_size"])
            ids_for = {name: ids for name in arms}
            ids_for["hf_local"] = ids % (fo.CONFIG["vocab_size"] // fo.TP)
            fns = {name: fo.step_fns(arm, ids_for[name]) for name, arm in arms.items()}
            timings = {mode: common.interleaved_timings(
                {name: pair[idx] for name, pair in fns.items()}, warmup=warmup, rounds=rounds)
                for mode, idx in (("fwd", 0), ("fwd+bwd", 1))}
        finally:
            common.destroy_pg()
    print(f"model: tiny Llama {fo.LAYERS} layers, fake PG tp={fo.TP}; {common.machine_note()}")
    rows = [[name, t["median"] * 1e3, timings["fwd+bwd"][name]["median"] * 1e3,
             common.paired_ratio(t, timings["fwd"]["hf_local"]),
             common.paired_ratio(timings["fwd+bwd"][name], timings["fwd+bwd"]["hf_local"])]
            for name, t in timings["fwd"].items()]
    print(common.format_table(["variant", "fwd ms", "fwd+bwd ms", "fwd / floor",
                               "f+b / floor"], rows))
    both = timings["fwd+bwd"]
    print("overhead_breakdown: " + " ".join(
        f"{name}={common.paired_ratio(both[name], both['hf_local'])}" for name in VARIANTS))
    return 0

if __name__ == "__main__":
    sys.exit(main())
