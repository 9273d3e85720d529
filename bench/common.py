"""Shared helpers for ``bench/forward_overhead.py`` and ``bench/install_time.py``.

Both benchmarks put the hpcodegen runtime next to torch's ``parallelize_module`` on the same
tiny Llama, so the model config, the equivalent torch plan, the fake process group set-up,
the artifact generation and the timing loop live here once. torch and transformers load
lazily inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import gc
import io
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- model config
def tiny_llama_config(layers: int = 4, *, hidden: int = 128, heads: int = 4, kv_heads: int = 2,
                      intermediate: int | None = None, vocab: int = 512) -> dict[str, Any]:
    """An HF ``config.json`` dict for a small random-weight Llama (no download).

    Heads and kv heads must divide the tp size used with it; ``head_dim`` is written out so
    a local-shape copy (heads / tp) keeps the same head size.
    """
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate or 2 * hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "use_cache": False,
    }


def write_config_dir(config: Mapping[str, Any], directory: str | os.PathLike[str]) -> Path:
    """Write ``config.json`` into ``directory`` (created) and return the directory."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path


def build_model(config: Mapping[str, Any], *, seed: int = 0, model_cls: type | None = None,
                **overrides: Any) -> Any:
    """A fp32 CPU Llama from ``config`` (transformers' class unless ``model_cls``), seeded.

    The same seed gives the same weights in every process, so ranks and arms agree.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    data = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    data.update(overrides)
    hf_config = LlamaConfig(**data)
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = (model_cls or LlamaForCausalLM)(hf_config)
    return model.to(torch.float32)


# ----------------------------------------------------------------------------- torch TP plan
def torch_tp_plan(layers: int, *, shard_embedding: bool = True) -> dict[str, Any]:
    """The ``parallelize_module`` plan equivalent to the generated artifact (Megatron TP).

    Colwise q/k/v/gate/up, rowwise o/down, vocab-parallel embedding (replicated ids in,
    replicated activations out) and a colwise lm_head that gathers the logits.
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {"lm_head": ColwiseParallel(output_layouts=Replicate())}
    if shard_embedding:
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
    for i in range(layers):
        prefix = f"model.layers.{i}"
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "mlp.gate_proj", "mlp.up_proj"):
            plan[f"{prefix}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"{prefix}.{name}"] = RowwiseParallel()
    return plan


def apply_torch_tp(model: Any, mesh: Any, layers: int, *, shard_embedding: bool = True) -> Any:
    """``parallelize_module`` with :func:`torch_tp_plan` (returns the same model)."""
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, mesh, torch_tp_plan(layers, shard_embedding=shard_embedding))


# ----------------------------------------------------------------------------- process groups
def init_fake_pg(world_size: int, rank: int = 0) -> Any:
    """Initialise the fake process group (collectives return at once) and a 1-D tp mesh
    (:func:`hpcodegen.derive.world.start_fake_mesh`).

    What is left on the clock is the framework's own cost: dispatch, hooks, Python.
    """
    from hpcodegen.derive.world import start_fake_mesh

    return start_fake_mesh({"tp": world_size}, rank)


def destroy_pg() -> None:
    """Tear the default process group down if one is up."""
    from hpcodegen.derive.world import end_world

    end_world()


# ----------------------------------------------------------------------------- hpcodegen arm
def hpcodegen_runtime_missing() -> str | None:
    """None when ``parallelize_from_generated`` imports, else why not (one line)."""
    try:
        from hpcodegen.runtime import parallelize_from_generated  # noqa: F401
    except Exception as exc:  # the arm is skipped with this reason, never a traceback
        return f"hpcodegen runtime unavailable: {type(exc).__name__}: {exc}"
    return None


def build_hpcodegen_model(config: Mapping[str, Any], mesh: Any, artifact_dir: Path, *,
                          seed: int = 0) -> Any:
    """The model built from the artifact's generated classes, then installed on ``mesh``."""
    from hpcodegen.runtime import parallelize_from_generated

    model = build_model(config, seed=seed, model_cls=generated_model_class(artifact_dir))
    parallelize_from_generated(model, mesh, artifact_dir)
    return model


def generated_model_class(artifact_dir: Path) -> type:
    """The entry class (``meta.model_class``) of the artifact's generated modeling module.

    Loaded the way ``hpcodegen launch`` does: verify's checks first, then the runtime's
    loader (cached per directory, so timing an install afterwards does not re-import it).
    """
    from hpcodegen.runtime import generated_model_class as model_class
    from hpcodegen.runtime import import_verified_module
    from hpcodegen.runtime.api import load_verified_meta

    loaded = load_verified_meta(artifact_dir)
    return model_class(loaded.plan, import_verified_module(loaded))


def generate_artifact(config_dir: Path, tp: int, out_dir: Path, *, sp: bool = False) -> Path:
    """Generate an artifact for ``config_dir`` at ``tp`` into ``out_dir``.

    In-process (:func:`hpcodegen.generate.api.run_generate`, what ``hpcodegen generate``
    calls): no second interpreter, so no second torch import.
    """
    from hpcodegen.generate.api import GenerateArgs, run_generate

    out, err = io.StringIO(), io.StringIO()
    code = run_generate(GenerateArgs(model_dir=config_dir, tp=tp, out=out_dir, sp=sp), out, err)
    if code != 0:
        raise RuntimeError(f"hpcodegen generate exited {code}: {err.getvalue().strip()}")
    return out_dir


# ----------------------------------------------------------------------------- timing
def interleaved_timings(arms: Mapping[str, Callable[[], Any]], *, warmup: int, rounds: int,
                        settle: int = 1, seed: int = 0) -> dict[str, dict[str, float]]:
    """``{arm: {"median": s, "min": s}}`` per call, the arms taking turns.

    Taking turns spreads the noise of a shared machine over every arm alike, instead of
    letting a burst of someone else's work land on one arm's whole block. Each turn first
    runs ``settle`` untimed calls, then times one: what is timed is a call that follows a
    call of the same arm, as every step of a training loop does. The order of the turns is
    shuffled every round (seeded): a fixed order charges each arm for the caches its
    predecessor left, an effect of 5-8% between two identical models (measured: two
    instances of one compiled model, and the ``A/A control`` line of
    ``forward_overhead.py``). The median is the headline figure; the minimum (noise only
    ever adds time) is the cleanest estimate of the work itself when the machine is loaded.
    """
    for fn in arms.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in arms}
    order = list(arms)
    shuffle = random.Random(seed).shuffle
    clock = time.perf_counter
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            fn = arms[name]
            for _ in range(settle):
                fn()
            t0 = clock()
            fn()
            samples[name].append(clock() - t0)
    return {name: {**summary(vals), "samples": vals} for name, vals in samples.items()}


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median and minimum of timing samples (seconds)."""
    return {"median": statistics.median(values), "min": min(values)}


def paired_ratio(num: Mapping[str, Any] | None, den: Mapping[str, Any] | None) -> str:
    """The median over rounds of ``num``'s time over ``den``'s in the same round, to 2
    decimals (``n/a`` when either is missing).

    Why: the machine's speed drifts over a run (here medians sat up to 60% above minima),
    and two calls of the same round ran seconds apart at most; a ratio of the two arms'
    overall medians carries the drift, the median of per-round ratios far less of it.
    Timings from :func:`interleaved_timings` (their ``samples`` are aligned by round).
    """
    if not num or not den or "samples" not in num or "samples" not in den:
        return "n/a"
    ratios = [a / b for a, b in zip(num["samples"], den["samples"], strict=True) if b > 0]
    return f"{statistics.median(ratios):.2f}" if ratios else "n/a"


def time_once(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of one call and its result, after a full GC.

    The collection first keeps garbage left by earlier work (a previous model) from being
    charged to this call; GC stays on during the call, as its own garbage is its cost.
    """
    gc.collect()
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


# ----------------------------------------------------------------------------- output
def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width text table (no rich: the figures are pasted into README.md)."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


def ratio(num: float | None, den: float | None) -> str:
    """``num / den`` to 2 decimals, ``n/a`` when either side is missing."""
    if num is None or den is None or den <= 0:
        return "n/a"
    return f"{num / den:.2f}"


def machine_note() -> str:
    """One line naming the machine the figures come from."""
    import torch

    return (f"python {platform.python_version()}, torch {torch.__version__}, "
            f"{os.cpu_count()} cpus, torch threads {torch.get_num_threads()}")
