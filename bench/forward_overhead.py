"""Per-call cost of the hpcodegen runtime against torch TP and a hand-written lower bound.

The same tiny Llama and batch run at tp=2 under: the hpcodegen runtime on a generated
artifact; torch ``parallelize_module`` with the equivalent plan (DTensor dispatch and module
hooks on every call); a hand-written Megatron-style forward (explicit collectives on local
tensors: the floor); HF's own ``tp_plan`` when accelerate is installed. A reference row runs
transformers' model at the local shapes with no collectives at all (the HF Python floor).

First on the fake process group (collectives return at once, so only framework overhead is
left), then on 2 real gloo ranks, forward-only and forward+backward, medians of many calls.
On gloo the hand-written and hpcodegen logits must match (a sanity check that the lower
bound computes the same thing). Run: ``python bench/forward_overhead.py [--quick | --smoke]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from handwritten import HandwrittenLlama

TP = 2
LAYERS = 4
BATCH, SEQ = 2, 32
CONFIG = common.tiny_llama_config(LAYERS, hidden=128, heads=4, kv_heads=2, vocab=512)
#: ``--smoke``: the smallest model every arm runs on (one layer, short sequences), so the
#: three ``torch.compile`` arms trace one decoder layer each, not four (on dynamo's
#: ``eager`` backend: :data:`COMPILE_BACKEND`)
SMOKE_LAYERS, SMOKE_SEQ = 1, 8
SMOKE_CONFIG = common.tiny_llama_config(SMOKE_LAYERS, hidden=64, heads=4, kv_heads=2, vocab=128)
ARM_LABELS = {
    "hpcodegen": "hpcodegen runtime",
    "parallelize_module": "torch parallelize_module",
    "handwritten": "hand-written Megatron",
    "hf_tp_plan": "HF tp_plan",
    "hf_local": "ref: HF local shapes, no comm",
    "hf_local_again": "ref: the same, a second instance (A/A control)",
    "hpcodegen_compiled": "hpcodegen, torch.compile",
    "parallelize_module_compiled": "parallelize_module, torch.compile",
    "handwritten_compiled": "hand-written, torch.compile",
}
#: arms timed forward-only (compiling a backward graph too would double the compile time)
FORWARD_ONLY = ("hpcodegen_compiled", "parallelize_module_compiled", "handwritten_compiled")
#: the ``torch.compile`` backend of the three compiled arms; None: torch's default,
#: inductor. ``--smoke`` sets dynamo's ``eager`` backend: the same capture and the same
#: calls of this script (``compile_parallelized`` with its options, ``Module.compile``,
#: ``torch.compile``, the failure note), no C++ codegen and compiler runs. A cold inductor
#: compile of hpcodegen's arm was two thirds of the smoke run's CPU; inductor on hpcodegen's
#: model is checked where it is the point (``launch --compile`` on gloo ranks,
#: tests/launch/test_compile_loss_parallel.py)
COMPILE_BACKEND: str | None = None


def use_smoke_size() -> None:
    """Switch the module to the ``--smoke`` model and sequence (a check of the script, not a
    measurement). Module-level, so every arm, the gloo ranks (which call this again after
    their spawn re-imports the module) and the report read the same size."""
    global LAYERS, SEQ, CONFIG, COMPILE_BACKEND
    LAYERS, SEQ, CONFIG = SMOKE_LAYERS, SMOKE_SEQ, SMOKE_CONFIG
    COMPILE_BACKEND = "eager"


@contextmanager
def smoke_size() -> Iterator[None]:
    """:func:`use_smoke_size` for a ``with`` block, the module's sizes put back after: for a
    caller whose process goes on (``overhead_breakdown.py``'s ``main`` in a test)."""
    global LAYERS, SEQ, CONFIG, COMPILE_BACKEND
    saved = LAYERS, SEQ, CONFIG, COMPILE_BACKEND
    use_smoke_size()
    try:
        yield
    finally:
        LAYERS, SEQ, CONFIG, COMPILE_BACKEND = saved


# ----------------------------------------------------------------------------- arms
def build_arms(mesh: Any, artifact_dir: Path | None, notes: list[str],
               hf_dir: Path | None = None, compiled: bool = False) -> dict[str, Any]:
    """Every runnable arm as ``name -> model-like callable(ids) -> logits`` plus its params."""
    arms: dict[str, Any] = {}
    missing = common.hpcodegen_runtime_missing()
    if missing is None and artifact_dir is not None:
        arms["hpcodegen"] = common.build_hpcodegen_model(CONFIG, mesh, artifact_dir)
    else:
        notes.append(f"hpcodegen: skipped: {missing or 'no artifact'}")
    arms["parallelize_module"] = common.apply_torch_tp(common.build_model(CONFIG), mesh, LAYERS)
    arms["handwritten"] = HandwrittenLlama(common.build_model(CONFIG), mesh)
    if importlib.util.find_spec("accelerate") is None or hf_dir is None:
        notes.append("hf_tp_plan: skipped: accelerate not installed")
    else:
        arms["hf_tp_plan"] = hf_tp_plan_model(hf_dir, mesh)
    if compiled:
        build_compiled_arms(arms, mesh, artifact_dir, notes)
    return arms


def hf_tp_plan_model(hf_dir: Path, mesh: Any) -> Any:
    """transformers' own TP: the saved tiny model loaded with ``from_pretrained(tp_plan=
    "auto")`` on ``mesh`` (what a user would pick instead of hpcodegen)."""
    import torch
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    # transformers reads torchrun's variables; mirror the process group we already have
    for var, value in (("RANK", dist.get_rank()), ("LOCAL_RANK", dist.get_rank()),
                       ("WORLD_SIZE", dist.get_world_size()),
                       ("LOCAL_WORLD_SIZE", dist.get_world_size())):
        os.environ[var] = str(value)
    model = LlamaForCausalLM.from_pretrained(hf_dir, tp_plan="auto", device_mesh=mesh,
                                             dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    return model.eval()


def build_compiled_arms(arms: dict[str, Any], mesh: Any, artifact_dir: Path | None,
                        notes: list[str]) -> None:
    """Fresh copies of the three TP arms, each under ``torch.compile`` (whole model)."""
    import torch

    options = {"backend": COMPILE_BACKEND} if COMPILE_BACKEND else {}
    if "hpcodegen" in arms and artifact_dir is not None:
        from hpcodegen.runtime.compile import compile_parallelized

        model = common.build_hpcodegen_model(CONFIG, mesh, artifact_dir)
        arms["hpcodegen_compiled"] = compile_parallelized(model, "model", **options)
    model = common.apply_torch_tp(common.build_model(CONFIG), mesh, LAYERS)
    model.compile(**options)
    arms["parallelize_module_compiled"] = model
    hand = HandwrittenLlama(common.build_model(CONFIG), mesh)
    hand.forward = torch.compile(hand.forward, **options)
    arms["handwritten_compiled"] = hand
    ids = batch_ids(CONFIG["vocab_size"])
    for name in FORWARD_ONLY:  # compile now (not in the timed warm-up); drop what fails
        if name not in arms:
            continue
        try:
            with torch.no_grad():
                logits_fn(arms[name])(ids)
        except Exception as exc:  # reported as a skipped arm, the others still run
            notes.append(f"{name}: skipped: torch.compile failed: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}")
            del arms[name]
    notes.append(f"compiled arms: torch.compile of the whole model "
                 f"({COMPILE_BACKEND or 'inductor'}), forward only")
    if COMPILE_BACKEND:
        notes.append(f"--smoke: the compiled arms use the {COMPILE_BACKEND!r} backend (no "
                     "inductor): their times are not comparable")


def local_shape_model() -> Any:
    """transformers' model at one rank's shapes (heads, ffn and vocab divided by tp)."""
    return common.build_model(CONFIG, num_attention_heads=CONFIG["num_attention_heads"] // TP,
                              num_key_value_heads=CONFIG["num_key_value_heads"] // TP,
                              intermediate_size=CONFIG["intermediate_size"] // TP,
                              vocab_size=CONFIG["vocab_size"] // TP)


def logits_fn(arm: Any) -> Any:
    """A closure ``ids -> logits`` over an arm (HF modules return an output object)."""
    if isinstance(arm, HandwrittenLlama):
        return arm.forward
    return lambda ids: arm(input_ids=ids, use_cache=False).logits


def step_fns(arm: Any, ids: Any) -> tuple[Any, Any]:
    """(forward-only under no_grad, forward+backward with grads cleared) for one arm."""
    import torch

    run = logits_fn(arm)
    params = list(arm.parameters())

    def forward() -> None:
        with torch.no_grad():
            run(ids)

    def forward_backward() -> None:
        for p in params:
            p.grad = None
        run(ids).float().pow(2).mean().backward()

    return forward, forward_backward


Timings = dict[str, dict[str, dict[str, Any]]]


def measure(arms: dict[str, Any], ids_for: dict[str, Any], args: argparse.Namespace) -> Timings:
    """``{mode: {arm: {"median": s, "min": s}}}`` for forward and forward+backward."""
    fns = {name: step_fns(arm, ids_for[name]) for name, arm in arms.items()}
    out = {}
    for mode, idx in (("fwd", 0), ("fwd+bwd", 1)):
        out[mode] = common.interleaved_timings(
            {name: pair[idx] for name, pair in fns.items()
             if idx == 0 or name not in FORWARD_ONLY},
            warmup=args.warmup, rounds=args.rounds)
    return out


def batch_ids(vocab: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(1234)
    return torch.randint(0, vocab, (BATCH, SEQ), generator=gen)


# ----------------------------------------------------------------------------- fake PG
def run_fake_pg(artifact_dir: Path | None, args: argparse.Namespace, notes: list[str],
                hf_dir: Path | None = None) -> Timings:
    """Rank 0 of a 2-rank fake process group: every collective is free."""
    mesh = common.init_fake_pg(TP, rank=0)
    try:
        arms = build_arms(mesh, artifact_dir, notes, hf_dir, compiled=not args.no_compile)
        arms["hf_local"] = local_shape_model()
        arms["hf_local_again"] = local_shape_model()  # how far apart two equal arms land
        ids = batch_ids(CONFIG["vocab_size"])
        ids_for = {name: ids for name in arms}
        ids_for["hf_local"] = ids_for["hf_local_again"] = ids % (CONFIG["vocab_size"] // TP)
        timings = measure(arms, ids_for, args)
        if args.profile:
            for name in args.profile:
                if name in arms:
                    args.profiles.append(profile_arm(name, arms[name], ids_for[name]))
        return timings
    finally:
        common.destroy_pg()


def profile_arm(name: str, arm: Any, ids: Any, calls: int = 200) -> str:
    """cProfile ``calls`` no-grad forwards of one arm: the top functions, as text."""
    import cProfile
    import pstats

    forward, _ = step_fns(arm, ids)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        forward()
    profiler.disable()
    buf = io.StringIO()
    buf.write(f"\n--- cProfile: {calls} fake-PG forwards of {ARM_LABELS[name]}\n")
    stats = pstats.Stats(profiler, stream=buf)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(20)
    return buf.getvalue()


# ----------------------------------------------------------------------------- gloo
def gloo_worker(rank: int, store_path: str, artifact_dir: str | None, args: argparse.Namespace,
                result_path: str, hf_dir: str | None = None) -> None:
    """One of 2 real gloo ranks: check logits agree, then time every arm in lock step."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    if args.smoke:
        use_smoke_size()
    store = dist.FileStore(store_path, TP)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=TP)
    try:
        mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
        notes: list[str] = []
        arms = build_arms(mesh, Path(artifact_dir) if artifact_dir else None, notes,
                          Path(hf_dir) if hf_dir else None)
        ids = batch_ids(CONFIG["vocab_size"])
        errors = check_logits(arms, ids)
        timings = measure(arms, {name: ids for name in arms}, args)
        if rank == 0:
            Path(result_path).write_text(json.dumps({"timings": timings, "errors": errors}))
        dist.barrier()  # neither rank tears gloo down while the other still talks
    finally:
        dist.destroy_process_group()


def check_logits(arms: dict[str, Any], ids: Any) -> dict[str, float]:
    """Max |logits - full-model logits| per arm; hand-written vs hpcodegen must be <= 1e-5.

    The local gradient shards of hpcodegen and hand-written must agree too, so the
    forward+backward figures compare the same computation.
    """
    import torch

    with torch.no_grad():
        reference = common.build_model(CONFIG)(input_ids=ids, use_cache=False).logits
        logits = {name: logits_fn(arm)(ids) for name, arm in arms.items()}
    errors = {name: float((out - reference).abs().max()) for name, out in logits.items()}
    if errors["handwritten"] > 1e-5:
        raise AssertionError(f"hand-written logits off the full model by {errors['handwritten']}")
    if "hpcodegen" in logits:
        diff = float((logits["hpcodegen"] - logits["handwritten"]).abs().max())
        errors["hpcodegen_vs_handwritten"] = diff
        if diff > 1e-5:
            raise AssertionError(f"hand-written and hpcodegen logits differ by {diff:.3g}")
        errors["grad_rel_hpcodegen_vs_handwritten"] = compare_grads(
            arms["hpcodegen"], arms["handwritten"], ids)
    return errors


def compare_grads(model: Any, hand: HandwrittenLlama, ids: Any) -> float:
    """Largest relative gradient difference over a few local shards; raises above 1e-4."""
    for arm in (model, hand):
        for p in arm.parameters():
            p.grad = None
        logits_fn(arm)(ids).float().pow(2).mean().backward()
    last = len(hand.layers) - 1
    pairs = {"model.embed_tokens.weight": hand.embed, "lm_head.weight": hand.lm_head,
             "model.norm.weight": hand.norm,
             "model.layers.0.self_attn.q_proj.weight": hand.layers[0]["q"],
             f"model.layers.{last}.self_attn.o_proj.weight": hand.layers[last]["o"],
             f"model.layers.{last}.mlp.down_proj.weight": hand.layers[last]["down"],
             "model.layers.0.input_layernorm.weight": hand.layers[0]["ln1"]}
    from hpcodegen.runtime.shards import local_grad

    worst = 0.0
    for name, param in pairs.items():
        ref, scale = param.grad, float(param.grad.abs().max())
        grad = local_grad(model.get_parameter(name))  # a DTensor parameter's local shard
        diff = float((grad - ref).abs().max()) / max(scale, 1e-30)
        if not scale > 0 or not diff <= 1e-4:
            raise AssertionError(f"{name}: hpcodegen and hand-written gradients differ "
                                 f"(relative {diff:.3g})")
        worst = max(worst, diff)
    return worst


def run_gloo(artifact_dir: Path | None, args: argparse.Namespace, tmp: Path,
             hf_dir: Path | None = None) -> dict[str, Any]:
    import torch.multiprocessing as mp

    result = tmp / "gloo.json"
    mp.spawn(gloo_worker, args=(str(tmp / "store"), str(artifact_dir) if artifact_dir else None,
                                args, str(result), str(hf_dir) if hf_dir else None),
             nprocs=TP, join=True)
    return json.loads(result.read_text())


# ----------------------------------------------------------------------------- report
def print_table(title: str, timings: Timings) -> None:
    fwd, both = timings["fwd"], timings["fwd+bwd"]

    def over(mode: dict[str, dict[str, float]], name: str, ref: str) -> str:
        return common.ratio(mode[name]["median"], (mode.get(ref) or {}).get("median"))

    def ms(mode: dict[str, dict[str, float]], name: str, key: str) -> float | None:
        return mode[name][key] * 1e3 if name in mode else None

    rows = [[ARM_LABELS[name], ms(fwd, name, "median"), ms(fwd, name, "min"),
             ms(both, name, "median"), ms(both, name, "min"),
             over(fwd, name, "handwritten"),
             over(both, name, "handwritten") if name in both else "-"]
            for name in fwd]
    print(f"\n{title}")
    print(common.format_table(["arm", "fwd ms", "(min)", "fwd+bwd ms", "(min)", "fwd / hand",
                               "f+b / hand"], rows))
    if "hpcodegen" in fwd and "hf_local" in fwd:
        print(f"hpcodegen / HF local-shape floor (the runtime's own cost): "
              f"fwd {over(fwd, 'hpcodegen', 'hf_local')}, "
              f"fwd+bwd {over(both, 'hpcodegen', 'hf_local')}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few iterations (development)")
    parser.add_argument("--smoke", action="store_true",
                        help="check the script, not the figures: a 1-layer model, sequence 8, "
                             "compiled on dynamo's eager backend, one round (tests/bench)")
    parser.add_argument("--no-gloo", action="store_true", help="fake process group only")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave out the torch.compile arms (they take minutes to compile)")
    parser.add_argument("--profile", nargs="+", choices=sorted(ARM_LABELS), default=[],
                        metavar="ARM", help="cProfile these arms' fake-PG forwards too")
    parser.add_argument("--rounds", type=int, metavar="N",
                        help="timed rounds (default 150, --quick 30; one warm-up call)")
    args = parser.parse_args()
    args.profiles = []
    rounds = args.rounds
    args.warmup, args.rounds = (3, 30) if args.quick else (10, 150)
    if args.smoke:  # every arm timed once (after interleaved_timings' untimed settle call)
        args.warmup, args.rounds = 0, 1
    if rounds:  # a run that checks the script, not a measurement (tests/bench)
        args.warmup, args.rounds = 1, rounds
    return args


def main() -> int:
    import torch

    args = parse_args()
    torch.set_num_threads(1)
    if args.smoke:
        use_smoke_size()
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hpcg-bench-") as tmp_name:
        tmp = Path(tmp_name)
        artifact_dir = prepare_artifact(tmp, notes)
        hf_dir = prepare_hf_dir(tmp)
        fake = run_fake_pg(artifact_dir, args, notes, hf_dir)
        gloo = None if args.no_gloo else run_gloo(artifact_dir, args, tmp, hf_dir)
    print(f"model: tiny Llama {LAYERS} layers, hidden {CONFIG['hidden_size']}, "
          f"batch {BATCH}x{SEQ}, fp32, tp={TP}; {common.machine_note()}")
    print(f"iterations: {args.warmup} warm-up calls per arm, then {args.rounds} rounds; each "
          "round every arm in a shuffled order runs an untimed call, then the timed one; ms per "
          "call, median (and min)")
    for note in dict.fromkeys(notes):
        print(note)
    print_table("fake process group (rank 0 of 2): framework overhead only", fake)
    if gloo is not None:
        print_table("2 gloo ranks (rank 0's clock)", gloo["timings"])
        errs = ", ".join(f"{k}={v:.2e}" for k, v in gloo["errors"].items())
        print(f"equivalence on gloo (logits: max abs diff vs the unsharded model; grads: "
              f"relative): {errs}")
    for text in args.profiles:
        print(text)
    fwd, both = fake["fwd"], fake["fwd+bwd"]

    def paired(mode: dict[str, Any], num: str, den: str) -> str:
        return common.paired_ratio(mode.get(num), mode.get(den))

    print(f"A/A control (two instances of the same floor model; the noise of these ratios): "
          f"fwd {paired(fwd, 'hf_local_again', 'hf_local')} "
          f"fwd+bwd {paired(both, 'hf_local_again', 'hf_local')}")
    print("ratios: medians of per-round ratios (common.paired_ratio); the tables: ratios of "
          "medians")
    print(f"forward_overhead: "
          f"vs_parallelize_module={paired(fwd, 'hpcodegen', 'parallelize_module')} "
          f"vs_handwritten={paired(fwd, 'hpcodegen', 'handwritten')} "
          f"vs_hf_floor={paired(fwd, 'hpcodegen', 'hf_local')} "
          f"vs_hf_floor_bwd={paired(both, 'hpcodegen', 'hf_local')} "
          f"vs_hf_tp_plan={paired(fwd, 'hpcodegen', 'hf_tp_plan')} "
          f"compiled_vs_handwritten={paired(fwd, 'hpcodegen_compiled', 'handwritten')}")
    return 0


def prepare_hf_dir(tmp: Path) -> Path | None:
    """The tiny model saved with ``save_pretrained`` for the HF tp_plan arm (None without
    accelerate, which transformers' ``from_pretrained(tp_plan=...)`` requires)."""
    if importlib.util.find_spec("accelerate") is None:
        return None
    common.build_model(CONFIG).save_pretrained(tmp / "hf_model")
    return tmp / "hf_model"


def prepare_artifact(tmp: Path, notes: list[str]) -> Path | None:
    """Generate the tp=2 artifact for CONFIG, or None (with a note) when generate fails."""
    if common.hpcodegen_runtime_missing() is not None:
        return None
    config_dir = common.write_config_dir(CONFIG, tmp / "model")
    try:
        return common.generate_artifact(config_dir, TP, tmp / "artifact")
    except Exception as exc:  # reported as a skipped arm, the other arms still run
        notes.append(f"hpcodegen: skipped: generate failed: {exc}")
        return None


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
