"""Peak host memory per rank while loading a safetensors checkpoint at tp 1, 2 and 4.

A ~58M-parameter Llama (hidden 512, 8 layers, vocab 32000, fp32: ~234 MB) is saved by
transformers as 3 safetensors shards plus ``model.safetensors.index.json`` in a temporary
directory, artifacts are generated for tp 1, 2 and 4, and each arm runs as a real
``hpcodegen launch ... -- probe`` job (gloo ranks). Each rank reports its peak resident
memory (``VmHWM`` from ``/proc/self/status``) and the seconds from before ``setup()`` to
the end of its first forward.

Arms:
* ``sharded``: ``hpcodegen.launch.setup()`` (meta-device build, each rank reads only its
  shards with ``safe_open(...).get_slice``).
* ``full-then-shard`` (tp 2): every rank builds the full model, loads the whole state dict
  and only then shards it (what launch did before).
* ``baseline``: the same ``setup()`` on a tiny Llama at the same tp: the interpreter,
  torch, transformers and gloo, with no checkpoint to speak of.

ratio = (max over ranks of peak RSS - baseline peak) / checkpoint bytes. Goals: tp2 <= 0.6,
tp4 <= 0.35 (a rank holds checkpoint/tp plus transient slices). Last line:
``load_memory: tp2_ratio=... tp4_ratio=...``. Run: ``python bench/load_memory.py``
(about 2-4 min on 2 cores; wrap it in ``flock LOCKFILE`` on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

BIG = dict(layers=8, hidden=512, heads=8, kv_heads=8, intermediate=1408, vocab=32000)
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, intermediate=128, vocab=256)
TPS = (1, 2, 4)

PROBE = '''
import json, os, sys, time
import torch
t0 = time.perf_counter()
out, mode = sys.argv[1], sys.argv[2]
if mode == "full-then-shard":
    from safetensors.torch import load_file
    from hpcodegen.hf import load_transformers_config, read_hf_config
    from hpcodegen.launch.model import checked_artifact, parallelize, resolve_model_dir
    from hpcodegen.launch.rank import init_rank
    ctx = init_rank()
    directory = resolve_model_dir(None, ctx.meta.artifact_dir)
    config, _ = read_hf_config(directory)
    art = checked_artifact(ctx.meta.artifact_dir, config)
    model = art.model_class()(load_transformers_config(config))
    state = {}
    for f in sorted(directory.glob("*.safetensors")):
        state.update(load_file(str(f)))
    model.load_state_dict(state)
    del state
    parallelize(model, ctx, art)
    vocab = model.config.vocab_size
else:
    import hpcodegen.launch
    model, _ = hpcodegen.launch.setup()
    vocab = model.config.vocab_size
with torch.no_grad():
    model(input_ids=torch.randint(0, vocab, (1, 16)))
seconds = time.perf_counter() - t0
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
rank = int(os.environ["RANK"])
with open(os.path.join(out, f"{mode}-rank{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "peak_rss_kib": hwm, "seconds": seconds}, fh)
'''


def save_checkpoint(config: dict[str, Any], directory: Path, shards: int) -> int:
    """Save a seeded model with transformers into ``shards`` files; returns tensor bytes."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    data = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    model = AutoModelForCausalLM.from_config(LlamaConfig(**data))
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    limit = f"{total // shards // 1000 + 1000}KB" if shards > 1 else "100GB"
    model.save_pretrained(directory, max_shard_size=limit)
    common.write_config_dir(config, directory)  # the config the artifacts were made from
    return total


def run_arm(artifact: Path, model_dir: Path, tp: int, mode: str, out: Path) -> dict[str, Any]:
    """One launch; ``{"peak_mib": max over ranks, "seconds": max over ranks, "wall": s}``."""
    probe = out / "probe.py"
    probe.write_text(PROBE)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hpcodegen", "launch", str(artifact),
                           "--nproc", str(tp), "--device", "cpu", "--model-dir", str(model_dir),
                           "--timeout", "300", "--json", "--", str(probe), str(out), mode],
                          capture_output=True, text=True, cwd=common.REPO, timeout=360)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} tp{tp} failed: {proc.stdout[-800:]} {proc.stderr[-800:]}")
    ranks = [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in range(tp)]
    for r in range(tp):
        (out / f"{mode}-rank{r}.json").unlink()
    return {"peak_mib": max(r["peak_rss_kib"] for r in ranks) / 1024,
            "seconds": max(r["seconds"] for r in ranks), "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-competitor", action="store_true",
                        help="skip the full-then-shard arm")
    args = parser.parse_args()
    rows, ratios = [], {}
    with tempfile.TemporaryDirectory(prefix="hpc-load-memory-") as tmp:
        root = Path(tmp)
        big, tiny = root / "big", root / "tiny"
        ckpt_bytes = save_checkpoint(common.tiny_llama_config(**BIG), big, shards=3)
        save_checkpoint(common.tiny_llama_config(**TINY), tiny, shards=1)
        files = sorted(p.name for p in big.glob("*.safetensors"))
        print(f"checkpoint: {ckpt_bytes / 1e6:.1f} MB in {len(files)} files + index "
              f"({common.machine_note()})", flush=True)
        for tp in TPS:
            arts = {name: common.generate_artifact(d, tp, root / f"{name}_tp{tp}")
                    for name, d in (("big", big), ("tiny", tiny))}
            base = run_arm(arts["tiny"], tiny, tp, "sharded", root)
            arms = [("sharded", run_arm(arts["big"], big, tp, "sharded", root))]
            if tp == 2 and not args.no_competitor:
                arms.append(("full-then-shard",
                             run_arm(arts["big"], big, tp, "full-then-shard", root)))
            for name, res in arms:
                ratio = (res["peak_mib"] - base["peak_mib"]) * 2**20 / ckpt_bytes
                ratios.setdefault(tp, ratio)
                rows.append([tp, name, res["peak_mib"], base["peak_mib"], ratio,
                             res["seconds"], res["wall"]])
                print(f"  tp{tp} {name}: peak {res['peak_mib']:.0f} MiB, ratio {ratio:.2f}",
                      flush=True)
    print(common.format_table(
        ["tp", "arm", "peak RSS MiB", "baseline MiB", "ratio", "to 1st forward s",
         "launch wall s"], rows))
    print(f"load_memory: tp2_ratio={ratios[2]:.2f} tp4_ratio={ratios[4]:.2f} "
          f"tp1_ratio={ratios[1]:.2f}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
