"""Synthetic artifacts of any size, shaped like a generated Llama TP+SP plan (no torch).

``write_synthetic(dir, n_entries)`` writes a complete artifact: a modeling file, ``__init__.py``
and a ``codegen_meta.json`` with exactly ``n_entries`` ``param_plan`` entries (per layer: two SP
norms, attention and MLP boundaries, and their projections as parameter-only entries), the
output hashes and a recomputable hpcodegen signature, so ``verify`` checks it for real.

Run ``python bench/synthetic.py DIR N`` to write one by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hpcodegen import GENERATOR_NAME, __version__
from hpcodegen.artifact.digest import bytes_digest, meta_signature

SEQ = {"tp": "S(1)"}
REP = {"tp": "R"}
PSUM = {"tp": "P(sum)"}
LAYER_ENTRIES = 10


def _boundary(params: dict[str, Any], inp: str, in_src: dict[str, str], in_dst: dict[str, str],
              out_src: dict[str, str], out_dst: dict[str, str]) -> dict[str, Any]:
    return {"params": params, "in_src": {inp: in_src}, "in_dst": {inp: in_dst},
            "out_src": {"output": out_src}, "out_dst": {"output": out_dst}, "is_boundary": True}


def _layer(i: int) -> dict[str, dict[str, Any]]:
    p = f"model.layers.{i}"
    norm = _boundary({"weight": REP}, "hidden_states", SEQ, SEQ, SEQ, SEQ)
    norm["partial_grad_params"] = ["weight"]
    col = {"params": {"weight": {"tp": "S(0)"}}, "is_boundary": False}
    row = {"params": {"weight": {"tp": "S(1)"}}, "is_boundary": False}
    return {
        f"{p}.input_layernorm": norm,
        f"{p}.self_attn": _boundary({}, "hidden_states", SEQ, REP, PSUM, SEQ),
        f"{p}.self_attn.q_proj": col, f"{p}.self_attn.k_proj": col,
        f"{p}.self_attn.v_proj": col, f"{p}.self_attn.o_proj": row,
        f"{p}.post_attention_layernorm": dict(norm),
        f"{p}.mlp": _boundary({}, "x", SEQ, REP, PSUM, SEQ),
        f"{p}.mlp.gate_proj": col, f"{p}.mlp.up_proj": col,
    }


def _classes(plan: dict[str, Any]) -> dict[str, str]:
    names = {"input_layernorm": "LlamaRMSNorm", "post_attention_layernorm": "LlamaRMSNorm",
             "self_attn": "LlamaAttention", "mlp": "LlamaMLP", "norm": "LlamaRMSNorm",
             "embed_tokens": "Embedding", "lm_head": "Linear"}
    return {fqn: names[fqn.rsplit(".", 1)[-1]] for fqn, e in plan.items()
            if e.get("is_boundary") and fqn.rsplit(".", 1)[-1] in names}


def synthetic_plan(n_entries: int) -> dict[str, dict[str, Any]]:
    """Exactly ``n_entries`` entries: embed, final norm, lm_head and as many layers as fit."""
    plan: dict[str, dict[str, Any]] = {
        "model.embed_tokens": _boundary({"weight": {"tp": "S(0)"}}, "input", REP, REP, PSUM, SEQ),
        "model.norm": dict(_boundary({"weight": REP}, "hidden_states", SEQ, SEQ, SEQ, SEQ),
                           partial_grad_params=["weight"]),
        "lm_head": _boundary({"weight": {"tp": "S(0)"}}, "input", SEQ, REP,
                             {"tp": "S(-1)"}, {"tp": "S(-1)"}),
    }
    i = 0
    while len(plan) < n_entries:
        for fqn, entry in _layer(i).items():
            if len(plan) < n_entries:
                plan[fqn] = entry
        i += 1
    return dict(list(plan.items())[:n_entries])


MODELING = '"""Synthetic modeling module for benchmarks (never imported)."""\n'


def synthetic_meta(n_entries: int, outputs: dict[str, Any]) -> dict[str, Any]:
    """The meta dict of a synthetic artifact (signature recomputed over it)."""
    plan = synthetic_plan(n_entries)
    layers = sum(1 for f in plan if f.endswith(".self_attn"))
    meta: dict[str, Any] = {
        "codegen_version": "0.1.1", "signature": "", "yaml_path": "", "yaml_sha256": "0" * 64,
        "generator": {"name": GENERATOR_NAME, "version": __version__},
        "source": {"architecture": "LlamaForCausalLM", "model_type": "llama",
                   "module_name": "transformers.models.llama.modeling_llama",
                   "structure": {"hidden_size": 64, "num_hidden_layers": layers}},
        "parallel_dims": {"dp_size": 1, "tp_size": 2, "cp_size": 1, "ep_size": 1, "pp_size": 1,
                          "sequence_parallel": True, "loss_parallel": True},
        "mesh_dim_names": ["tp"], "model_name": "Llama", "model_class": "LlamaForCausalLM",
        "param_plan": plan, "boundary_classes": _classes(plan),
        "frozen_sharded_params": sorted(
            f"{fqn}.{rel}" for fqn, e in plan.items() for rel, named in e["params"].items()
            if named.get("tp", "R") != "R"),
        "entrypoints": {"parallelize": "hp_parallelize"}, "outputs": outputs,
        "injections": [], "tied_pairs": [], "special_handlers": {},
        "covered": {"sharding_plan": True, "module_overrides": False, "axes": []},
        "not_covered": ["mesh", "fsdp2", "pp", "activation_checkpoint", "compile"],
    }
    meta["signature"] = meta_signature(meta)
    return meta


TEMPLATE = Path(__file__).resolve().parent.parent / "examples" / "llama_tp2_sp"
LAYER0 = "model.layers.0."


def _scaled_plan(plan: dict[str, Any], n_entries: int) -> dict[str, Any]:
    """A generated plan grown to ``n_entries`` by repeating its layer-0 entries."""
    layer0 = {k[len(LAYER0):]: v for k, v in plan.items() if k.startswith(LAYER0)}
    fixed = {k: v for k, v in plan.items() if not k.startswith("model.layers.")}
    out = dict(fixed)
    i = 0
    while len(out) < n_entries:
        for rel, entry in layer0.items():
            if len(out) < n_entries:
                out[f"model.layers.{i}.{rel}"] = entry
        i += 1
    return dict(sorted(out.items()))


def whole_layer_entries(n_entries: int, template: Path = TEMPLATE) -> int:
    """The largest entry count <= ``n_entries`` whose grown plan ends on a whole layer (a
    model of that many layers then matches it parameter for parameter)."""
    plan = json.loads((template / "codegen_meta.json").read_text())["param_plan"]
    per_layer = sum(1 for k in plan if k.startswith(LAYER0))
    fixed = sum(1 for k in plan if not k.startswith("model.layers."))
    return fixed + per_layer * max(1, (n_entries - fixed) // per_layer)


def write_from_template(directory: str | Path, n_entries: int,
                        template: Path = TEMPLATE) -> Path:
    """Grow a generated example artifact to ``n_entries`` entries (verify-clean: the files,
    hashes, class contracts and signature stay consistent)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for f in template.iterdir():
        if f.is_file() and f.name != "codegen_meta.json":
            (out / f.name).write_bytes(f.read_bytes())
    meta = json.loads((template / "codegen_meta.json").read_text())
    src_classes = meta.get("boundary_classes") or {}
    plan = _scaled_plan(meta["param_plan"], n_entries)
    meta["param_plan"] = plan
    meta["boundary_classes"] = {
        fqn: src_classes.get(fqn) or src_classes[LAYER0 + fqn.split(".", 3)[3]]
        for fqn in plan if fqn in src_classes or (
            fqn.startswith("model.layers.") and LAYER0 + fqn.split(".", 3)[3] in src_classes)}
    meta["frozen_sharded_params"] = sorted(
        f"{fqn}.{rel}" if rel else fqn for fqn, e in plan.items()
        for rel, named in (e.get("params") or {}).items()
        if any(v != "R" for v in named.values()))
    layers = len({f.split(".")[2] for f in plan if f.startswith("model.layers.")})
    meta.setdefault("source", {}).setdefault("structure", {})["num_hidden_layers"] = layers
    meta["signature"] = meta_signature(meta)
    (out / "codegen_meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return out


def write_synthetic(directory: str | Path, n_entries: int) -> Path:
    """Write an artifact of ``n_entries`` plan entries; returns its directory.

    Grown from ``examples/llama_tp2_sp`` when that example exists, else built from scratch
    (then ``verify``'s source check fails on the stub modeling file, but it still runs).
    """
    if (TEMPLATE / "codegen_meta.json").is_file():
        return write_from_template(directory, n_entries)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = {"modeling_Llama_gen_npu.py": MODELING.encode(),
             "modeling_Llama_gen_npu.py.diff": b"",
             "__init__.py": b'"""Synthetic artifact."""\n'}
    for name, data in files.items():
        (out / name).write_bytes(data)
    roles = {"modeling": "modeling_Llama_gen_npu.py", "diff": "modeling_Llama_gen_npu.py.diff",
             "init": "__init__.py"}
    outputs = {role: bytes_digest(files[name]) for role, name in roles.items()}
    meta = synthetic_meta(n_entries, outputs)
    (out / "codegen_meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python bench/synthetic.py DIR N_ENTRIES")
    print(write_synthetic(sys.argv[1], int(sys.argv[2])))
