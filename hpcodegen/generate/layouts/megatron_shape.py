"""Read a :class:`hpcodegen.plan.megatron.ModelShape` off a meta-device model (lazy torch).

Which layer holds what is read from the modules, not from config fields that differ per
family: a decoder layer is an element of the model's longest ``ModuleList`` of modules;
it holds attention when a child module owns projections named like attention's
(``q_proj``, ``qkv_proj``, ``query_key_value``, ``kv_b_proj``...), routed experts when a
descendant is an ``experts`` module with packed ``[E, ...]`` weights (HF's
``moe_tp_experts``), shared experts when a sibling of those experts is a module named
``shared_expert(s)``, and a dense MLP when a child is named ``mlp``/``feed_forward`` with no
experts. Parameters are then classed as Megatron places them (plan/megatron.py).
"""

from __future__ import annotations

from typing import Any

from hpcodegen.plan.megatron import LayerShape, ModelShape

ATTENTION_NAMES = ("q_proj", "qkv_proj", "query_key_value", "c_attn", "Wqkv", "kv_b_proj",
                   "q_b_proj")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe")
#: Linears Megatron keeps whole: MLA's down-projections, routers and expert gates
WHOLE_LINEARS = ("q_a_proj", "kv_a_proj_with_mqa", "gate", "router", "shared_expert_gate")
#: row-parallel projections: their bias is added once, whole
ROW_LINEARS = ("o_proj", "down_proj", "dense", "c_proj", "out_proj", "dense_4h_to_h", "w2")


def _layers(model: Any) -> tuple[str, list[Any]]:
    from torch import nn

    best: tuple[str, list[Any]] = ("", [])
    for fqn, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best[1]):
            best = (fqn, list(module))
    return best


def _experts(layer: Any) -> Any:
    for _, module in layer.named_modules():
        if hasattr(module, "is_concatenated") and hasattr(module, "has_gate"):
            return module
        if type(module).__name__.endswith("Experts") and any(
                p.dim() >= 3 for p in module.parameters(recurse=False)):
            return module
    return None


def _layer_shape(layer: Any) -> LayerShape:
    names = {n.rsplit(".", 1)[-1] for n, _ in layer.named_modules()}
    attention = any(n in names for n in ATTENTION_NAMES)
    experts = _experts(layer)
    if experts is not None:
        shared = any(n in ("shared_expert", "shared_experts", "shared_mlp") for n in names)
        return LayerShape(attention, "moe", shared)
    children = {n for n, _ in layer.named_children()}
    return LayerShape(attention, "dense" if children & set(MLP_NAMES) else "")


def _split_over_tp(module: Any, leaf: str, name: str, param: Any) -> bool:
    """Megatron splits embeddings, projections (not the down-projections, routers and gates
    it keeps whole, nor a row-parallel projection's bias) and per-head attention sinks."""
    from torch import nn

    if isinstance(module, nn.Embedding):
        return True
    if isinstance(module, nn.Linear):
        return leaf not in WHOLE_LINEARS and not (name == "bias" and leaf in ROW_LINEARS)
    return param.dim() == 1 and name == "sinks"


def _classify_params(model: Any, experts: set[int]) -> tuple[int, int, int]:

    tp = expert = whole = 0
    seen: set[int] = set()
    for fqn, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen:  # a tied weight counts once
                continue
            seen.add(id(p))
            leaf = fqn.rsplit(".", 1)[-1]
            n = p.numel()
            if id(module) in experts:
                expert += n
            elif _split_over_tp(module, leaf, name, p):
                tp += n
            else:
                whole += n
    return tp, expert, whole


def model_shape(model: Any, config: dict[str, Any]) -> ModelShape:
    """The model's :class:`ModelShape` (see the module docstring)."""
    from hpcodegen.plan.moe import expert_count

    _, layers = _layers(model)
    shapes = tuple(_layer_shape(layer) for layer in layers)
    experts = {id(e) for e in (_experts(layer) for layer in layers) if e is not None}
    tp, expert, whole = _classify_params(model, experts)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    get = lambda key: config.get(key) or text.get(key) or 0  # noqa: E731
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = emb is not None and head is not None and getattr(emb, "weight", None) is \
        getattr(head, "weight", None)
    return ModelShape(hidden=get("hidden_size"), vocab=get("vocab_size"), layers=shapes,
                      top_k=get("num_experts_per_tok"), experts=expert_count(config),
                      tp_params=tp, expert_params=expert, whole_params=whole, tied=tied)
