"""Context parallelism: causal balance per layout, K/V gather bytes, activation memory.

Three measurements of hpcodegen's CP runtime, each against its alternative in one run:

1. **balance**: causal attention work per cp rank, max over mean, at cp 2, 4 and 8 (the worst
   is printed). The work is the number of unmasked score entries of each rank's mask rows,
   counted on the rows the runtime itself builds (its layout index tensors and mask
   function, :mod:`hpcodegen.runtime.cp.attention`) for a causal model, head-tail against
   contiguous.
2. **kv bytes**: what the runtime all-gathers per K and V (at the kv-head count, counted on
   the tensors handed to its gather on a GQA model: 32 query heads, 8 kv heads, Llama-3-8B's
   ratio), over what gathering K/V expanded to the query heads would move (the existing
   system's order: expand, then gather).
3. **activation bytes**: bytes the autograd graph saves for the backward on one rank during
   a forward (``saved_tensors_hooks``, each storage counted once) at cp 2 over cp 1, same
   model (8 layers, hidden 512, 8 heads, 2 kv heads; ``--quick``: 2 layers), same tp (1),
   same global batch. Both arms run on torch's fake process group (one process;
   collectives return shaped tensors), so only the sharding differs. Every per-token
   activation halves; what a cp rank keeps beyond that is its mask rows (one ``S/cp x S``
   tensor per forward, shared by the layers) and each layer's gathered K/V (the whole
   sequence at the kv-head count), so the ratio is ``0.5 + (mask + K/V) / activations``: it
   falls toward 0.5 as the layers widen or deepen.

Run: ``python bench/cp.py [--quick]``; the last line is ``cp: balance_headtail=...
balance_contiguous=... kv_bytes_vs_expanded=... activation_bytes_cp2_vs_cp1=...
ulysses_vs_allgather_llama8b_cp8=...`` (the last: inspect-plan's predicted bytes per rank
of a Llama-3.1-8B attention layer, forward and backward, Ulysses over all-gather at cp 8;
the cp/(g+1) rule says 5/8).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

CPS = (2, 4, 8)


def rank_work(seq: int, cp: int, layout: str) -> list[int]:
    """Unmasked causal entries of every cp rank's mask rows, as the runtime builds them."""
    from transformers.masking_utils import causal_mask_function

    from hpcodegen.runtime.collectives.comm import Comm
    from hpcodegen.runtime.cp.attention import mask_function
    from hpcodegen.runtime.cp.state import BatchView, CPState

    out = []
    for rank in range(cp):
        state = CPState(Comm(None), cp, rank, layout)
        q, kv = state.indices(seq, "cpu")
        state.batch = BatchView(q, kv)
        rows = mask_function(state)(1, q.shape[0], q.shape[0],
                                    mask_function=causal_mask_function)
        out.append(int((rows == 0).sum()))  # additive: 0 where a score counts
        del rows
    return out


def balance(seq: int, layout: str) -> tuple[float, dict[int, float]]:
    per_cp = {}
    for cp in CPS:
        work = rank_work(seq, cp, layout)
        per_cp[cp] = max(work) / (sum(work) / cp)
    return max(per_cp.values()), per_cp


def _parallel(config: dict[str, Any], cp: int, work: Path) -> tuple[Any, Any]:
    """The model parallelized at ``cp`` x tp 1 on the fake group (cp 1: unsharded)."""
    import torch

    from hpcodegen.artifact.bundle import write_bundle
    from hpcodegen.derive.world import end_world, start_fake_mesh
    from hpcodegen.generate.api import build_bundle
    from hpcodegen.launch.rank.model import model_class
    from hpcodegen.runtime import parallelize_from_generated

    # cp 1 runs the cp 2 artifact's classes unsharded: one artifact serves both arms
    artifact = work / f"cp{max(cp, 2)}"
    if not artifact.exists():
        write_bundle(artifact, build_bundle(config, 1, False, None, "bench", cp=max(cp, 2)))
    from hpcodegen.hf import load_transformers_config

    hf_config = load_transformers_config(config)
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_class(artifact, config)(hf_config)
    if cp > 1:
        end_world()  # the previous cp's group
        mesh = start_fake_mesh({"cp": cp})
        parallelize_from_generated(model, mesh, artifact, hf_config=hf_config)
    return model, artifact


def kv_bytes_ratio(work: Path) -> tuple[float, int, int]:
    """Bytes handed to the K/V gather over those of K/V expanded to the query heads."""
    import torch

    from hpcodegen.runtime.cp import shard_batch

    config = common.tiny_llama_config(2, hidden=256, heads=32, kv_heads=8, vocab=256)
    model, _ = _parallel(config, 2, work)
    gathered = []
    state = model.model.layers[0].self_attn.__dict__["_hp_cp"]
    inner = state.kv

    def counting(x: torch.Tensor) -> torch.Tensor:
        gathered.append(x.numel() * x.element_size())
        return inner(x)
    for layer in model.model.layers:
        layer.self_attn._hp_cp_attention.gather = counting
    batch = shard_batch(model, torch.randint(0, 256, (1, 64)))
    with torch.no_grad():
        model(**batch.inputs)
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    expanded = sum(gathered) * heads // kv
    return sum(gathered) / expanded, sum(gathered), expanded


def saved_bytes(model: Any, ids: Any) -> int:
    """Bytes the autograd graph saves during one forward (each storage once)."""
    import torch

    from hpcodegen.runtime.cp import cp_state, shard_batch

    storages: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t
    inputs = shard_batch(model, ids).inputs if cp_state(model) is not None else \
        {"input_ids": ids, "use_cache": False}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**inputs).logits.float().sum()
    return sum(storages.values())


def activation_ratio(work: Path, seq: int, layers: int = 8) -> tuple[float, int, int]:
    import torch

    config = common.tiny_llama_config(layers, hidden=512, heads=8, kv_heads=2, vocab=256)
    config["max_position_embeddings"] = seq
    ids = torch.randint(0, 256, (1, seq), generator=torch.Generator().manual_seed(0))
    one = saved_bytes(_parallel(config, 1, work)[0], ids)
    two = saved_bytes(_parallel(config, 2, work)[0], ids)
    return two / one, one, two


LLAMA_8B = Path(__file__).resolve().parent / "configs" / "llama-3.1-8b"


def layer_bytes_by_method(work: Path, cp: int = 8, seq: int = 8192,
                          layers: int | None = None) -> dict[str, float]:
    """inspect-plan's predicted bytes per rank of one Llama-3.1-8B attention layer (forward
    and backward, bf16, batch 1), for artifacts generated with ``--cp-method allgather``
    and ``ulysses`` at cp ``cp`` (the generated plans, priced by the tool itself).

    ``layers``: the model cut to that many decoder layers (``--quick``). The figure is per
    layer (the layers' bytes over their count), so the depth leaves it as it is; the
    generate and predict of all 32 layers were a third of the quick run's CPU."""
    import io
    import json

    from hpcodegen.artifact.bundle import write_bundle
    from hpcodegen.generate.api import build_bundle
    from hpcodegen.hf import read_hf_config
    from hpcodegen.inspect.options import InspectOptions
    from hpcodegen.inspect.run import run_inspect

    config, _ = read_hf_config(LLAMA_8B)
    config_dir = LLAMA_8B
    if layers is not None:
        config = {**config, "num_hidden_layers": layers}
        config_dir = common.write_config_dir(config, work / "config")
    out: dict[str, float] = {}
    for method in ("allgather", "ulysses"):
        artifact = work / method
        write_bundle(artifact, build_bundle(config, 1, False, None, "bench", cp=cp,
                                            cp_method=method))
        text = io.StringIO()
        code = run_inspect(InspectOptions(path=str(artifact), hf_config=str(config_dir),
                                          batch=1, seq=seq, dtype="bf16", as_json=True),
                           out=text, err=io.StringIO())
        if code != 0:
            raise SystemExit(f"inspect-plan failed on {artifact}: {text.getvalue()[:400]}")
        rows = json.loads(text.getvalue())["volume"]["boundaries"]
        layer = [r for r in rows if r["fqn"].startswith("model.layers.{") and
                 r["fqn"].endswith("self_attn")]
        out[method] = sum(r["forward_bytes"] + r["backward_bytes"] for r in layer) / \
            sum(r.get("count", 1) for r in layer)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: short sequences, 2-layer models (the activation "
                             "figure is indicative)")
    args = parser.parse_args(argv)
    seq = 256 if args.quick else 8192
    if args.quick:
        import torch

        # one intra-op thread: at these sizes a second OpenMP thread has no work to share and
        # only spins, which on a busy machine cost more CPU than the run itself
        torch.set_num_threads(1)
    headtail, per_ht = balance(seq, "headtail")
    contiguous, per_c = balance(seq, "contiguous")
    print(f"causal work per rank, max/mean at sequence {seq}:")
    print(common.format_table(["cp", "headtail", "contiguous"],
                              [[cp, per_ht[cp], per_c[cp]] for cp in CPS]))
    from hpcodegen.derive.world import end_world

    with tempfile.TemporaryDirectory() as tmp:
        try:
            kv_ratio, ours, expanded = kv_bytes_ratio(Path(tmp) / "kv")
            print(f"K/V gathered per forward: {ours} bytes at 8 kv heads; {expanded} "
                  "expanded to 32 query heads")
            act_ratio, one, two = activation_ratio(Path(tmp) / "act",
                                                   128 if args.quick else 2048,
                                                   2 if args.quick else 8)
            print(f"saved for backward, one rank: cp1 {one} bytes, cp2 {two} bytes")
        finally:  # the fake group of the last cp arm (main may run in a caller's process)
            end_world()
        per_layer = layer_bytes_by_method(Path(tmp) / "methods",
                                          layers=2 if args.quick else None)
        print("Llama-3.1-8B attention layer at cp 8, seq 8192, bf16, per rank forward + "
              f"backward: all-gather {per_layer['allgather']:.0f} bytes, Ulysses "
              f"{per_layer['ulysses']:.0f} bytes (rule cp/(g+1) = 8/5)")
    ulysses = per_layer["ulysses"] / per_layer["allgather"]
    print(f"cp: balance_headtail={headtail:.3f} balance_contiguous={contiguous:.3f} "
          f"kv_bytes_vs_expanded={kv_ratio:.3f} activation_bytes_cp2_vs_cp1={act_ratio:.3f} "
          f"ulysses_vs_allgather_llama8b_cp8={ulysses:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
