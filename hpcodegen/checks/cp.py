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
* the declared inner transitions are those of the wrapper's method, for the same names on
  both sides, under an ``inner_wrapper`` (all-gather: key/value ``cp S(2) -> R``; Ulysses:
  query/key/value and the output ``cp S(2) -> S(1)``; the hybrid: the exchange on
  ``cp_ulysses`` and the gather on ``cp_allgather``; an unknown wrapper: one of those);
* every CP attention runs one method and Ulysses degree; a hybrid's ``ulysses_degree``
  divides cp with ``1 < U < cp``; the heads a Ulysses record froze (``cp_heads``) pass the
  heads rule at the plan's tp (:func:`hpcodegen.plan.cp.heads_problem`): query heads divide
  over ``tp*U``, kv heads over it or into it (replicated);
* ``cp_layout`` without cp does nothing (a warning).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from hpcodegen.checks.context import as_dict, plan_entries, pointer
from hpcodegen.errors import Finding, error, warning
from hpcodegen.placement import parse_placement
from hpcodegen.plan.codec import PlanFormatError, injection_from_json
from hpcodegen.plan.cp import (
    ALLGATHER,
    CP,
    CP_AXES,
    HYBRID,
    METHODS,
    ULYSSES_DEGREE,
    cp_method,
    cp_size,
    heads_problem,
    kv_transitions,
    method_transitions,
    ulysses_degree,
)
from hpcodegen.plan.entry import axis_sizes

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
            extra = sorted(set(as_dict(named)) - set(CP_AXES))
            if extra:
                yield error("plan.cp_kv", pointer("injections", index, side, name),
                            f"{fqn}: the inner {name} transition names axes {extra}; it "
                            "runs over cp only", expected=" or ".join(CP_AXES))
    try:
        typed = injection_from_json(record, ("injections", index))
    except PlanFormatError:  # a shape the schema check reports
        return
    got = _shape(kv_transitions(typed))
    method = cp_method(typed)
    allowed = [method] if method is not None else list(METHODS)
    if not any(got == _implied(m) for m in allowed):
        want = _implied(allowed[0])
        yield error("plan.cp_kv", pointer("injections", index, "inner_in_src"),
                    f"{fqn}: declared {_describe(got)}; the "
                    f"{method or 'CP'} attention runs {_describe(want)}"
                    + ("" if method else " (or another method's transitions)"),
                    expected=_describe(want))


def _shape(ts: Any) -> set[tuple[str, str, str, str, str]]:
    return {(t.side, t.name, t.axis, str(t.src), str(t.dst)) for t in ts}


def _implied(method: str) -> set[tuple[str, str, str, str, str]]:
    from hpcodegen.plan.codec import injection_from_json as parse

    record = {"match": "x", "inner_wrapper": "x", **method_transitions(method)}
    return _shape(kv_transitions(parse(record, ("injections",))))


def _describe(shape: set[tuple[str, str, str, str, str]]) -> str:
    return ", ".join(f"{name} {axis} {a} -> {b}" for _, name, axis, a, b in sorted(shape)) \
        or "no transition"


def _method(meta: Mapping[str, Any], index: int, fqn: str, record: Mapping[str, Any]
            ) -> Iterator[Finding]:
    """The method against the mesh (the hybrid's degree divides cp) and the heads rule on
    the heads the record froze (``cp_heads``)."""
    try:
        typed = injection_from_json(record, ("injections", index))
    except PlanFormatError:
        return
    method, cp = cp_method(typed), cp_size(meta)
    if method is None or method == ALLGATHER:
        return
    degree = ulysses_degree(typed, cp)
    if method == HYBRID and (degree < 2 or degree >= cp or cp % degree):
        yield error("plan.cp_method", pointer("injections", index, "inner_wrapper",
                                              ULYSSES_DEGREE),
                    f"{fqn}: a hybrid with ulysses_degree {degree or '(missing)'} on cp "
                    f"{cp}", expected="an integer U with 1 < U < cp_size dividing it")
        return
    heads = as_dict(record.get("cp_heads"))
    q, kv = heads.get("query"), heads.get("key_value")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (q, kv)):
        return  # a foreign Ulysses meta names no heads: the runtime checks them
    tp = max(axis_sizes(meta).get("tp", 1), 1)
    why = heads_problem(q, kv, tp, degree)
    if why is not None:
        yield error("plan.cp_ulysses_heads", pointer("injections", index, "cp_heads"),
                    f"{fqn}: {method} over {degree} cp ranks at tp {tp}: {why}",
                    expected="query heads dividing over tp*U; kv heads dividing over it or "
                             "into it (replicated)")


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
    methods: dict[tuple[str | None, int], str] = {}
    seen: set[int] = set()
    for index, fqn, record in _records(meta):
        if index not in seen:
            seen.add(index)
            yield from _kv(meta, fqn, index, record)
            yield from _method(meta, index, fqn, record)
            try:
                typed = injection_from_json(record, ("injections", index))
            except PlanFormatError:
                typed = None
            if cp_method(typed) is not None:
                key = (cp_method(typed), ulysses_degree(typed, cp_size(meta)))
                methods.setdefault(key, fqn)
        if record.get("inner_wrapper") is not None:
            wrapped[fqn] = index  # another system's wrapper may run cp its own way
    if len(methods) > 1:
        yield error("plan.cp_method", pointer("injections"),
                    "the CP attentions run different methods ("
                    + ", ".join(f"{m} U={u} at {f}" for (m, u), f in sorted(
                        methods.items(), key=lambda kv: str(kv))) + "): one cp mesh runs one",
                    expected="one method and Ulysses degree for every CP attention")
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


def _config_heads(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(query heads, kv heads)`` of an HF config (or its ``text_config``); None unknown."""
    for scope in (config, config.get("text_config")):
        if not isinstance(scope, Mapping):
            continue
        q = scope.get("num_attention_heads")
        kv = scope.get("num_key_value_heads", q)
        if isinstance(q, int) and isinstance(kv, int) and q > 0 and kv > 0:
            return q, kv
    return None


def config_heads_findings(meta: Mapping[str, Any], config: Mapping[str, Any]
                          ) -> Iterator[Finding]:
    """With ``--hf-config`` (pure: config JSON and meta): each Ulysses / hybrid record's
    frozen ``cp_heads`` must be the config's heads, and those heads must pass the heads rule
    at the plan's tp and Ulysses degree; a foreign Ulysses meta names no heads and gets the
    rule on the config's."""
    heads = _config_heads(config)
    cp = cp_size(meta)
    if heads is None or cp <= 1:
        return
    tp = max(axis_sizes(meta).get("tp", 1), 1)
    for index, fqn, record in _records(meta):
        try:
            typed = injection_from_json(record, ("injections", index))
        except PlanFormatError:
            continue
        method = cp_method(typed)
        if method in (None, ALLGATHER):
            continue
        frozen = as_dict(record.get("cp_heads"))
        if frozen and (frozen.get("query"), frozen.get("key_value")) != heads:
            yield error("model.cp_heads", pointer("injections", index, "cp_heads"),
                        f"{fqn}: cp_heads says {frozen.get('query')} query / "
                        f"{frozen.get('key_value')} kv heads; the config has {heads[0]} / "
                        f"{heads[1]}", expected=f"query {heads[0]}, key_value {heads[1]}")
        why = heads_problem(*heads, tp, ulysses_degree(typed, cp))
        if why is not None:
            yield error("model.cp_ulysses_heads", pointer("injections", index),
                        f"{fqn}: {method} (the config's heads): {why}")
        return  # one record speaks for the model's heads


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


__all__ = ["check_cp", "config_heads_findings"]
