"""Context-parallel rules of a frozen plan (part of the ``plan`` check; pure).

With ``parallel_dims.cp_size > 1`` (:mod:`hpcodegen.plan.cp`):

* a boundary value must keep its cp placement (``src == dst`` on cp): a boundary that moves
  the sequence between ``S(d)`` and ``R`` on cp outside an attention's K/V silently
  reorders or duplicates tokens (a head-tail rank's ``S(1)`` is not torch's chunk; a
  replicated value would be computed once per rank on different tokens);
* every parameter is replicated on cp (its gradient is a sum over cp, FSDP2's business);
* some attention has an ``inner_wrapper`` (hpcodegen's all-gathers K/V over cp; another
  system's may run cp its own way), and every module of its kind (same FQN up to the layer
  index) has one too: one that does not attends only to its rank's chunk;
* a declared K/V transition is ``S(2) -> R`` on cp only, for the same names on both sides,
  under an ``inner_wrapper``;
* ``cp_layout`` without cp does nothing (a warning).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from hpcodegen.checks.context import as_dict, plan_entries, pointer
from hpcodegen.errors import Finding, error, warning
from hpcodegen.placement import REPLICATE, Shard, parse_placement
from hpcodegen.plan.codec import PlanFormatError, injection_from_json
from hpcodegen.plan.cp import CP, KV_SEQ_DIM, cp_size, kv_transitions

_LAYER = re.compile(r"\.\d+(?=\.|$)")


def _cp_text(named: Any) -> Any:
    return as_dict(named).get(CP, "R")


def _same(a: Any, b: Any) -> bool:
    try:
        return parse_placement(a) == parse_placement(b)
    except (ValueError, TypeError):
        return a == b  # a bad placement is the placements check's finding


def _moves(meta: Mapping[str, Any]) -> Iterator[Finding]:
    for fqn, entry in plan_entries(meta).items():
        for side in ("in", "out"):
            src, dst = as_dict(entry.get(f"{side}_src")), as_dict(entry.get(f"{side}_dst"))
            for name in sorted(set(src) | set(dst)):
                a, b = _cp_text(src.get(name)), _cp_text(dst.get(name))
                if not _same(a, b):
                    yield error(
                        "plan.cp_moves_sequence", pointer("param_plan", fqn, f"{side}_dst", name),
                        f"{fqn}: {side}put {name!r} goes cp {a} -> {b}: a boundary that moves "
                        "the sequence over cp outside an attention's K/V reorders or "
                        "duplicates tokens", expected=f"cp {a} on both sides",
                        hint="only the attention's inner K/V all-gather leaves the cp chunk")


def _params(meta: Mapping[str, Any]) -> Iterator[Finding]:
    for fqn, entry in plan_entries(meta).items():
        for name, named in as_dict(entry.get("params")).items():
            text = _cp_text(named)
            if not _same(text, "R"):
                yield error("plan.cp_param", pointer("param_plan", fqn, "params", name, CP),
                            f"parameter placement cp {text}: parameters are replicated over "
                            "cp (each rank runs every weight on its own tokens)",
                            expected="cp R")


def _kv(meta: Mapping[str, Any], fqn: str, index: int, record: Mapping[str, Any]
        ) -> Iterator[Finding]:
    src, dst = record.get("inner_in_src"), record.get("inner_in_dst")
    if src is None and dst is None:
        return
    where = pointer("injections", index)
    if record.get("inner_wrapper") is None:
        yield error("plan.cp_kv", where, f"{fqn}: inner_in_src/inner_in_dst without an "
                    "inner_wrapper: nothing runs the declared transition")
    if set(as_dict(src)) != set(as_dict(dst)):
        yield error("plan.cp_kv", where, f"{fqn}: inner_in_src names {sorted(as_dict(src))} "
                    f"but inner_in_dst names {sorted(as_dict(dst))}")
    for side, values in (("inner_in_src", src), ("inner_in_dst", dst)):
        for name, named in as_dict(values).items():
            extra = sorted(set(as_dict(named)) - {CP})
            if extra:
                yield error("plan.cp_kv", pointer("injections", index, side, name),
                            f"{fqn}: the inner {name} transition names axes {extra}; it "
                            "runs over cp only", expected="cp")
    try:
        typed = injection_from_json(record, ("injections", index))
    except PlanFormatError:  # a shape the schema check reports
        return
    for t in kv_transitions(typed):
        if not (t.src == Shard(KV_SEQ_DIM) and t.dst == REPLICATE):
            yield error("plan.cp_kv", pointer("injections", index, "inner_in_src", t.name),
                        f"{fqn}: {t.name} cp {t.src} -> {t.dst}: the CP attention "
                        f"all-gathers the sequence dim {KV_SEQ_DIM} of [batch, kv_heads, seq, "
                        "head_dim]", expected=f"cp S({KV_SEQ_DIM}) -> R")


def _records(meta: Mapping[str, Any]) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    injections = meta.get("injections")
    for i, record in enumerate(injections if isinstance(injections, list) else ()):
        if not isinstance(record, Mapping):
            continue
        match = record.get("match")
        fqns = [match] if isinstance(match, str) else match if isinstance(match, list) else []
        for fqn in fqns:
            if isinstance(fqn, str):  # other shapes are the schema check's findings
                yield i, fqn, record


def _attention(meta: Mapping[str, Any]) -> Iterator[Finding]:
    wrapped: dict[str, int] = {}
    for index, fqn, record in _records(meta):
        yield from _kv(meta, fqn, index, record)
        if record.get("inner_wrapper") is not None:
            wrapped[fqn] = index  # another system's wrapper may run cp its own way
    if not wrapped:
        yield error("plan.cp_no_attention", pointer("injections"),
                    f"cp_size is {cp_size(meta)} but no attention has an inner_wrapper that "
                    "all-gathers K/V over cp: every token would only see its rank's chunk",
                    hint="regenerate the artifact with --cp")
        return
    kinds = {_LAYER.sub(".{}", fqn) for fqn in wrapped}
    for fqn in plan_entries(meta):
        if fqn not in wrapped and _LAYER.sub(".{}", fqn) in kinds:
            yield error("plan.cp_unwrapped_attention", pointer("param_plan", fqn),
                        f"{fqn} is the same attention as {sorted(wrapped)[0]} but has no cp "
                        "inner_wrapper: its queries would only see this rank's keys",
                        hint="add it to the CP attention injection's match")


def check_cp(meta: Mapping[str, Any]) -> Iterator[Finding]:
    """The cp rules (module docstring); nothing without a cp axis."""
    dims = as_dict(meta.get("parallel_dims"))
    if cp_size(meta) <= 1:
        if dims.get("cp_layout") is not None:
            yield warning("plan.cp_layout_unused", pointer("parallel_dims", "cp_layout"),
                          "cp_layout is set but cp_size is 1: nothing is cut over cp")
        return
    yield from _moves(meta)
    yield from _params(meta)
    yield from _attention(meta)


__all__ = ["check_cp"]
