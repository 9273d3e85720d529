"""The GPU lane: hpcodegen on one CUDA device, checked and timed against what users would
pick instead.

1. **The shipped examples at tp 1**: each example's generated model installed on a 1-rank
   mesh (the install is a no-op there) in bf16, forward and backward against transformers'
   own model with the same weights: logits and every gradient must be equal (max abs diff).
2. **A 2-rank fake-process-group step in bf16**: rank 0 of a fake group of the artifact's tp
   size; one forward, backward and AdamW step of the sharded model, checked against the
   unsharded model's structure: every local parameter and gradient has the shape the plan
   gives it (the unsharded shape split per placement), in bf16, and the collectives counted
   by ``CommDebugMode`` equal what ``inspect-plan`` predicts. (The fake group moves no
   data: the numbers need real ranks, ``launch --device cuda --nproc 2 --check-parity``.)
3. **One Llama-3-8B-shaped decoder layer at its tp 8 local shapes** (hidden 4096, 32 heads, 8
   kv heads, MLP 14336; a 8192-token vocabulary so that the layer dominates), rank 0 of a
   fake group of 8: forward and forward+backward of hpcodegen, the hand-written Megatron
   model (``bench/handwritten.py``) and ``parallelize_module``, eager and under
   ``torch.compile``, interleaved; the ratios are over the hand-written model.

Run: ``python bench/gpu.py [--quick] [--json OUT]`` on a machine with a CUDA device. Without
one it exits 2 saying so. ``--device cpu --smoke`` runs the same code on the CPU at tiny
shapes (eager only unless ``--compile``): a check of the script, not a measurement
(tests/bench runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from forward_overhead import step_fns
from handwritten import HandwrittenLlama

EXAMPLES = common.REPO / "examples"
#: Llama-3-8B's decoder layer (config.json of meta-llama/Meta-Llama-3-8B)
LLAMA3_8B_LAYER = {"hidden": 4096, "heads": 32, "kv_heads": 8, "intermediate": 14336,
                   "vocab": 8192, "layers": 1}
#: --smoke: two examples (plain and loss parallel) and the smallest layer tp 8 splits (8
#: heads of 8; the examples' width): a check of the script's code, not a measurement. On a
#: CPU every bf16 matmul is emulated, so the layer's size was most of the smoke's time
SMOKE_EXAMPLES = ["llama_tp2", "llama_tp2_sp_lp"]
SMOKE_LAYER = {"hidden": 64, "heads": 8, "kv_heads": 8, "intermediate": 128, "vocab": 128,
               "layers": 1}
#: --smoke: each arm timed once per mode after one untimed call (interleaved_timings'
#: settle), at sequence 8; the ratio column still reads every arm
SMOKE_ROUNDS, SMOKE_SEQ = 1, 8
LAYER_TP = 8
ARMS = ("hpcodegen", "handwritten", "parallelize_module")


def require_device(kind: str) -> None:
    """Exit 2 with the reason when ``kind`` cannot run here (the lane needs CUDA)."""
    import torch

    if kind == "cuda" and not torch.cuda.is_available():
        print(f"bench/gpu.py needs a CUDA device: torch {torch.__version__} sees none "
              f"(torch.cuda.is_available() is False; CUDA build: {torch.version.cuda}). "
              "Run it on a GPU machine, or `--device cpu --smoke` to check the script.",
              file=sys.stderr)
        sys.exit(2)


def fake_group(world: int, device: str) -> Any:
    """Rank 0 of a fake process group of ``world`` ranks and its 1-D ``tp`` mesh on
    ``device`` (an earlier group ended first)."""
    from hpcodegen.derive.world import end_world, start_fake_mesh

    end_world()
    return start_fake_mesh({"tp": world}, device=device)


def example_pair(artifact: Path, device: str, dtype: Any) -> Any:
    """The parity harness's pair (:func:`hpcodegen.parity.harness.build_pair`): transformers'
    model and the generated one with the same seeded weights, sdpa, in ``dtype`` on
    ``device`` (training mode: a step's model)."""
    from hpcodegen.parity.harness import build_pair, read_config

    config = read_config(EXAMPLES / "configs" / artifact.name.rsplit("_tp", 1)[0])
    pair = build_pair(artifact, config, dtype=dtype, eval_mode=False,
                      attn_implementation="sdpa")
    pair.reference.to(device)
    pair.sharded.to(device)
    return pair


def _ids(vocab: int, device: str, rows: int = 2, seq: int = 32) -> Any:
    import torch

    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (rows, seq), generator=gen).to(device)


def examples(names: list[str] | None) -> list[Path]:
    """The shipped example artifacts (``names``: only those)."""
    found = sorted(EXAMPLES.glob("*_tp*"))
    return [p for p in found if names is None or p.name in names]


def examples_at_tp1(device: str, dtype: Any, names: list[str] | None) -> list[list[Any]]:
    """Part 1: each example installed on a 1-rank mesh equals transformers' model (the
    parity harness's :func:`~hpcodegen.parity.harness.compare`: logits, every gradient)."""
    from hpcodegen.errors import HpcodegenError
    from hpcodegen.parity.harness import compare, install, token_batch

    rows = []
    for artifact in examples(names):
        mesh = fake_group(1, device)
        pair = example_pair(artifact, device, dtype)
        try:
            installed = install(pair, mesh)
        except HpcodegenError as exc:  # loss parallel has no meaning at tp 1: refused
            rows.append([artifact.name, "refused", exc.findings[0].code, "-"])
            continue
        ids, labels = token_batch(pair.config_dict["vocab_size"], 2, 32)
        r = compare(pair.sharded, pair.reference, pair.plan, installed,
                    {"input_ids": ids.to(device), "use_cache": False}, labels.to(device))
        ok = r.logits == 0.0 and r.grad == 0.0 and not r.odd
        rows.append([artifact.name, "equal" if ok else "DIFFERS", f"{r.logits:.2e}",
                     f"{r.grad:.2e}"])
    common.destroy_pg()
    return rows


def _local_tensor(tensor: Any) -> Any:
    """This rank's part: a DTensor parameter's local tensor, any other tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _local_shape(shape: tuple[int, ...], placements: tuple, world: int) -> tuple[int, ...]:
    from hpcodegen.checkpoint.layout import splits

    out = list(shape)
    for p in placements:
        if splits(p):
            out[p.dim] //= world
    return tuple(out)


def fake_step(device: str, dtype: Any, names: list[str] | None) -> list[list[Any]]:
    """Part 2: one bf16 step of each example on rank 0 of a fake group of its tp size; the
    collectives counted and predicted by the parity harness."""
    import torch

    from hpcodegen.parity.harness import count_collectives, install, predicted_collectives

    rows = []
    for artifact in examples(names):
        pair = example_pair(artifact, device, dtype)
        dims = pair.plan.parallel_dims
        world = dims.size("tp")
        mesh = fake_group(world, device)
        ref, gen, vocab = pair.reference, pair.sharded, pair.config_dict["vocab_size"]
        shapes = {n: tuple(p.shape) for n, p in ref.named_parameters()}
        info = install(pair, mesh).info
        ids = _ids(vocab, device)
        with count_collectives() as fwd_seen:
            logits = gen(input_ids=ids, use_cache=False).logits
        with count_collectives() as bwd_seen:
            logits.float().pow(2).mean().backward()
        torch.optim.AdamW(gen.parameters(), lr=1e-3).step()
        local = {n: _local_tensor(p) for n, p in gen.named_parameters()}  # DTensor params
        wrong = [n for n, p in gen.named_parameters()
                 if p.dtype != dtype or p.grad is None or p.grad.shape != p.shape
                 or tuple(local[n].shape) != _local_shape(shapes[n], info[n][0], world)]
        fwd, bwd = +fwd_seen, +bwd_seen
        counts_ok = (fwd, bwd) == predicted_collectives(pair.plan)
        vocab //= world if dims.loss_parallel else 1  # loss parallel: the logits stay sharded
        status = "ok" if not wrong and counts_ok and logits.shape[-1] == vocab else "DIFFERS"
        rows.append([artifact.name, world, status, dict(fwd), dict(bwd),
                     ", ".join(wrong[:3]) or "-"])
    common.destroy_pg()
    return rows


def layer_arms(dims: dict, device: str, dtype: Any, compiled: bool) -> tuple[dict, Any]:
    """The three arms at tp 8 on rank 0 of a fake group of 8 (and, compiled, three more)."""
    import torch

    config = common.tiny_llama_config(dims["layers"], hidden=dims["hidden"], heads=dims["heads"],
                                      kv_heads=dims["kv_heads"],
                                      intermediate=dims["intermediate"], vocab=dims["vocab"])
    config["max_position_embeddings"] = 8192
    # the artifact is read while the arms are built (its classes compiled from its bytes, its
    # plan installed); its directory is removed once they are
    with tempfile.TemporaryDirectory(prefix="hpcodegen-gpu-bench-") as tmp:
        work = Path(tmp)
        artifact = common.generate_artifact(common.write_config_dir(config, work / "cfg"),
                                            LAYER_TP, work / "art")
        mesh = fake_group(LAYER_TP, device)

        def build(name: str) -> Any:
            if name == "hpcodegen":
                model = common.build_model(config, model_cls=common.generated_model_class(artifact))
                from hpcodegen.runtime import parallelize_from_generated

                parallelize_from_generated(model.to(device, dtype), mesh, artifact)
                return model
            if name == "handwritten":
                return HandwrittenLlama(common.build_model(config).to(device, dtype), mesh)
            return common.apply_torch_tp(common.build_model(config).to(device, dtype), mesh,
                                         dims["layers"])

        arms = {name: build(name) for name in ARMS}
        if compiled:
            for name in ARMS:
                arm = build(name)
                if isinstance(arm, HandwrittenLlama):
                    arm.forward = torch.compile(arm.forward)
                elif name == "hpcodegen":
                    from hpcodegen.runtime.compile import compile_parallelized

                    arm = compile_parallelized(arm, "model")
                else:
                    arm.compile()
                arms[f"{name} compiled"] = arm
    return arms, config


def time_layer(dims: dict, device: str, dtype: Any, compiled: bool, rounds: int,
               warmup: int, seq: int) -> tuple[list[list[Any]], list[str]]:
    """Part 3: median per call of every arm, and its ratio over the hand-written one."""
    import torch

    arms, config = layer_arms(dims, device, dtype, compiled)
    ids = _ids(config["vocab_size"], device, rows=1, seq=seq)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows, notes = [], []
    for mode, idx in (("fwd", 0), ("fwd+bwd", 1)):
        fns = {}
        for name, arm in arms.items():
            fn = step_fns(arm, ids)[idx]
            fns[name] = (lambda f=fn: (f(), sync()))
        try:
            timings = common.interleaved_timings(fns, warmup=warmup, rounds=rounds)
        except Exception as exc:  # a compile failure is reported, the eager arms still time
            notes.append(f"{mode}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        for name in arms:
            base = "handwritten compiled" if name.endswith("compiled") else "handwritten"
            rows.append([mode, name, timings[name]["median"] * 1e3, timings[name]["min"] * 1e3,
                         common.paired_ratio(timings[name], timings[base])])
    common.destroy_pg()
    return rows, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (a script check)")
    parser.add_argument("--compile", action="store_true", help="with --smoke: compiled arms too")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    require_device(args.device)
    import warnings

    import torch

    # module hooks on HF output objects: torch's notice, not a finding of this script
    warnings.filterwarnings("ignore", message=".*backward hook", category=UserWarning)
    names = SMOKE_EXAMPLES if args.smoke else None
    dtype = torch.bfloat16
    device = args.device
    if device == "cpu":
        # one intra-op thread, as the CPU benchmarks (forward_overhead.py, install_time.py):
        # at these shapes a second OpenMP thread only spins, and on a busy machine its wait
        # made each bf16 call ~100x slower (measured: 224 ms against 1.7 ms a forward)
        torch.set_num_threads(1)
    where = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(f"# bench/gpu.py on {where}; {common.machine_note()}")
    tp1 = examples_at_tp1(device, dtype, names)
    print("\n## 1. the shipped examples at tp 1 (bf16) against transformers' model")
    print(common.format_table(["artifact", "result", "logits max diff", "grads max diff"], tp1))
    step = fake_step(device, dtype, names)
    print("\n## 2. one bf16 step on rank 0 of a fake group of the artifact's tp size")
    print(common.format_table(["artifact", "tp", "shapes+counts", "forward collectives",
                               "backward collectives", "wrong params"], step))
    dims = SMOKE_LAYER if args.smoke else LLAMA3_8B_LAYER
    compiled = args.compile or not args.smoke
    rounds, warmup = (SMOKE_ROUNDS, 0) if args.smoke else ((10, 3) if args.quick else (30, 5))
    rows, notes = time_layer(dims, device, dtype, compiled, rounds, warmup,
                             seq=SMOKE_SEQ if args.smoke else 4096)
    print(f"\n## 3. one Llama-3-8B-shaped layer at tp {LAYER_TP} local shapes "
          f"({dims}), bf16, fake group; ms per call; ratio over hand-written")
    print(common.format_table(["mode", "arm", "median ms", "min ms", "ratio"], rows))
    for note in notes:
        print(f"note: {note}")
    if args.json:
        args.json.write_text(json.dumps({"device": where, "tp1": tp1, "fake_step": step,
                                         "layer": rows, "notes": notes}, indent=2))
    bad = [r for r in tp1 if r[1] == "DIFFERS"] + [r for r in step if r[2] != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
