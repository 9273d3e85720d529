"""Does the plan split any layer over tp? A plan that leaves every layer whole is degenerate.

tp > 1 buys memory and speed only where a layer's weights are split. When no rule names a
module inside the model's layers (an encoder family with no HF plan and no package rule,
a recipe for another variant, HF plan keys of another transformers generation), the plan
still verifies and runs exactly, but it splits only the embedding and the head (hpcodegen's
defaults): every rank holds and computes every layer. ``generate`` says so (a warning;
``--strict`` refuses it), naming the layers and the rules that were in use.

*Layers* are the model's outermost repeated blocks: the children of an ``nn.ModuleList``
that are modules of their own (they hold sub-modules with parameters), not nested in
another such block. That takes in decoder and encoder layers, Mamba blocks and vision
towers alike, and leaves out lists of bare Linears (MusicGen's per-codebook heads, Gemma-3n's
AltUp projections) and experts nested in a layer. No family is named: the rule reads the
module tree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpcodegen.errors import Finding, warning
from hpcodegen.placement import is_shard
from hpcodegen.plan.entry import join_fqn
from hpcodegen.plan.fold import format_ranges
from hpcodegen.plan.types import TP, PlanEntry


def layer_blocks(model: Any) -> dict[str, str]:
    """``{fqn: class name}`` of the model's outermost repeated blocks (module docstring)."""
    from torch import nn

    blocks: dict[str, str] = {}
    for fqn, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or _inside(fqn, blocks):
            continue
        for name, child in module.named_children():
            if any(True for _ in child.parameters()) and any(
                    True for sub in child.children() if any(True for _ in sub.parameters())):
                blocks[join_fqn(fqn, name)] = type(child).__name__
    return blocks


def _inside(fqn: str, blocks: Mapping[str, str]) -> bool:
    return any(fqn.startswith(block + ".") or fqn == block for block in blocks)


def tp_split_params(plan: Mapping[str, PlanEntry]) -> list[str]:
    """Every parameter FQN the plan shards on tp (``S(d)``, ``SS(d,f)``)."""
    return [join_fqn(fqn, rel) for fqn, entry in plan.items()
            for rel, named in (entry.params or {}).items()
            if named.get(TP) is not None and is_shard(named[TP])]


def splits_a_layer(blocks: Mapping[str, str], plan: Mapping[str, PlanEntry]) -> bool:
    """Whether the plan shards some parameter inside one of ``blocks`` (:func:`layer_blocks`)
    on tp: the one rule for "the plan splits a layer", read by :func:`unsplit_layers` and by
    the coverage probe (:func:`hpcodegen.families.probe.layers_split`)."""
    return any(_inside(param, blocks) for param in tp_split_params(plan))


def fold_blocks(blocks: Mapping[str, str]) -> list[str]:
    """``model.layers.{0..31} (LlamaDecoderLayer x32)``: one line per list of blocks."""
    groups: dict[tuple[str, str], list[int]] = {}
    for fqn, cls in blocks.items():
        parent, _, index = fqn.rpartition(".")
        if index.isdigit():
            groups.setdefault((parent, cls), []).append(int(index))
        else:
            groups.setdefault((fqn, cls), [])
    lines = []
    for (parent, cls), indices in groups.items():
        if not indices:
            lines.append(f"{parent} ({cls})")
        else:
            where = f"{parent}.{{{format_ranges(indices)}}}" if len(indices) > 1 \
                else f"{parent}.{indices[0]}"
            lines.append(f"{where} ({cls} x{len(indices)})")
    return lines


def unsplit_layers(model: Any, plan: Mapping[str, PlanEntry], tp: int,
                   rules_in_use: Sequence[str]) -> Finding | None:
    """A warning when ``tp > 1`` and no parameter of any layer is split over tp, else None.

    ``rules_in_use`` describes where the rules came from (transformers' plan, the package
    rules, a recipe), for the reason the warning gives.
    """
    blocks = layer_blocks(model)
    if tp <= 1 or not blocks:
        return None
    if splits_a_layer(blocks, plan):
        return None
    split = tp_split_params(plan)
    outside = sorted({p.rpartition(".")[0] for p in split})
    what = "; ".join(fold_blocks(blocks))
    elsewhere = (f"only {', '.join(outside)} {'is' if len(outside) == 1 else 'are'} split"
                 if outside else "nothing is split")
    return warning(
        "generate.no_layer_split", next(iter(blocks)).rpartition(".")[0],
        f"--tp {tp} splits no layer: {what} stay whole on every rank (each rank holds and "
        f"computes all of them; {elsewhere}), because no tp rule names a module inside "
        f"them. Rules in use: {'; '.join(rules_in_use)}",
        hint="add recipe rules (colwise/rowwise) for the layers' projections (docs/generate.md), "
             "or run at --tp 1; docs/models.md lists the families without rules")


def rules_in_use(model: Any, hf: Sequence[tuple[str, str]], package_file: str | None,
                 recipe: Sequence[Any] | None) -> list[str]:
    """One phrase per rule source, as :func:`unsplit_layers` reports them."""
    arch = type(model).__name__
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return [
        f"transformers' tp plan of {arch}: {len(hf)} rule(s)" if hf
        else f"transformers ships no tp plan for {arch} (model_type {model_type!r})",
        f"package rules {package_file}" if package_file
        else f"no package rules for model_type {model_type!r}",
        f"recipe: {len(recipe)} rule(s)" if recipe else "no recipe",
    ]
