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

from hpcodegen.checks.context import as_dict, pointer
from hpcodegen.errors import Finding, error, warning
from hpcodegen.placement import REPLICATE, Placement
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
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import Injection, NamedPlacement, Plan

_LAYER = re.compile(r"\.\d+(?=\.|$)")


def _cp(named: NamedPlacement | None) -> Placement:
    return (named or EMPTY).get(CP, REPLICATE)


def _moves(plan: Plan) -> Iterator[Finding]:
    for fqn, entry in plan.entries.items():
        for side in ("in", "out"):
            src = getattr(entry, f"{side}_src") or EMPTY
            dst = getattr(entry, f"{side}_dst") or EMPTY
            for name in sorted(set(src) | set(dst)):
                a, b = _cp(src.get(name)), _cp(dst.get(name))
                if a != b:
                    yield error(
                        "plan.cp_moves_sequence", pointer("param_plan", fqn, f"{side}_dst", name),
                        f"{fqn}: {side}put {name!r} goes cp {a} -> {b}: a boundary that moves "
                        "the sequence over cp outside an attention's K/V reorders or "
                        "duplicates tokens", expected=f"cp {a} on both sides",
                        hint="only the attention's inner K/V all-gather leaves the cp chunk")


def _params(plan: Plan) -> Iterator[Finding]:
    for fqn, entry in plan.entries.items():
        for name, named in (entry.params or EMPTY).items():
            placement = _cp(named)
            if placement != REPLICATE:
                yield error("plan.cp_param", pointer("param_plan", fqn, "params", name, CP),
                            f"parameter placement cp {placement}: parameters are replicated "
                            "over cp (each rank runs every weight on its own tokens)",
                            expected="cp R")


def _kv(fqn: str, index: int, record: Injection) -> Iterator[Finding]:
    src, dst = record.inner_in_src, record.inner_in_dst
    if src is None and dst is None:
        return
    where = pointer("injections", index)
    if record.inner_wrapper is None:
        yield error("plan.cp_kv", where, f"{fqn}: inner_in_src/inner_in_dst without an "
                    "inner_wrapper: nothing runs the declared transition")
    if set(src or EMPTY) != set(dst or EMPTY):
        yield error("plan.cp_kv", where, f"{fqn}: inner_in_src names {sorted(src or EMPTY)} "
                    f"but inner_in_dst names {sorted(dst or EMPTY)}")
    for side, values in (("inner_in_src", src), ("inner_in_dst", dst)):
        for name, named in (values or EMPTY).items():
            extra = sorted(set(named) - set(CP_AXES))
            if extra:
                yield error("plan.cp_kv", pointer("injections", index, side, name),
                            f"{fqn}: the inner {name} transition names axes {extra}; it "
                            "runs over cp only", expected=" or ".join(CP_AXES))
    got = _shape(kv_transitions(record))
    method = cp_method(record)
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


def _method(plan: Plan, index: int, fqn: str, record: Injection) -> Iterator[Finding]:
    """The method against the mesh (the hybrid's degree divides cp) and the heads rule on
    the heads the record froze (``cp_heads``)."""
    method, cp = cp_method(record), cp_size(plan)
    if method is None or method == ALLGATHER:
        return
    degree = ulysses_degree(record, cp)
    if method == HYBRID and (degree < 2 or degree >= cp or cp % degree):
        yield error("plan.cp_method", pointer("injections", index, "inner_wrapper",
                                              ULYSSES_DEGREE),
                    f"{fqn}: a hybrid with ulysses_degree {degree or '(missing)'} on cp "
                    f"{cp}", expected="an integer U with 1 < U < cp_size dividing it")
        return
    heads = as_dict(record.cp_heads)
    q, kv = heads.get("query"), heads.get("key_value")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (q, kv)):
        return  # a foreign Ulysses meta names no heads: the runtime checks them
    tp = max(plan.dims.size("tp"), 1)
    why = heads_problem(q, kv, tp, degree)
    if why is not None:
        yield error("plan.cp_ulysses_heads", pointer("injections", index, "cp_heads"),
                    f"{fqn}: {method} over {degree} cp ranks at tp {tp}: {why}",
                    expected="query heads dividing over tp*U; kv heads dividing over it or "
                             "into it (replicated)")


def _records(plan: Plan) -> Iterator[tuple[int, str, Injection]]:
    for i, record in enumerate(plan.injections or ()):
        for fqn in record.fqns:
            yield i, fqn, record


def _attention(plan: Plan) -> Iterator[Finding]:
    wrapped: dict[str, int] = {}
    methods: dict[tuple[str | None, int], str] = {}
    seen: set[int] = set()
    for index, fqn, record in _records(plan):
        if index not in seen:
            seen.add(index)
            yield from _kv(fqn, index, record)
            yield from _method(plan, index, fqn, record)
            if cp_method(record) is not None:
                key = (cp_method(record), ulysses_degree(record, cp_size(plan)))
                methods.setdefault(key, fqn)
        if record.inner_wrapper is not None:
            wrapped[fqn] = index  # another system's wrapper may run cp its own way
    if len(methods) > 1:
        yield error("plan.cp_method", pointer("injections"),
                    "the CP attentions run different methods ("
                    + ", ".join(f"{m} U={u} at {f}" for (m, u), f in sorted(
                        methods.items(), key=lambda kv: str(kv))) + "): one cp mesh runs one",
                    expected="one method and Ulysses degree for every CP attention")
    if not wrapped:
        yield error("plan.cp_no_attention", pointer("injections"),
                    f"cp_size is {cp_size(plan)} but no attention has an inner_wrapper that "
                    "all-gathers K/V over cp: every token would only see its rank's chunk",
                    hint="regenerate the artifact with --cp")
        return
    kinds = {_LAYER.sub(".{}", fqn) for fqn in wrapped}
    for fqn in plan.entries:
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


def config_heads_findings(plan: Plan, config: Mapping[str, Any]) -> Iterator[Finding]:
    """With ``--hf-config`` (pure: config JSON and plan): each Ulysses / hybrid record's
    frozen ``cp_heads`` must be the config's heads, and those heads must pass the heads rule
    at the plan's tp and Ulysses degree; a foreign Ulysses meta names no heads and gets the
    rule on the config's."""
    heads = _config_heads(config)
    cp = cp_size(plan)
    if heads is None or cp <= 1:
        return
    tp = max(plan.dims.size("tp"), 1)
    for index, fqn, record in _records(plan):
        method = cp_method(record)
        if method in (None, ALLGATHER):
            continue
        frozen = as_dict(record.cp_heads)
        if frozen and (frozen.get("query"), frozen.get("key_value")) != heads:
            yield error("model.cp_heads", pointer("injections", index, "cp_heads"),
                        f"{fqn}: cp_heads says {frozen.get('query')} query / "
                        f"{frozen.get('key_value')} kv heads; the config has {heads[0]} / "
                        f"{heads[1]}", expected=f"query {heads[0]}, key_value {heads[1]}")
        why = heads_problem(*heads, tp, ulysses_degree(record, cp))
        if why is not None:
            yield error("model.cp_ulysses_heads", pointer("injections", index),
                        f"{fqn}: {method} (the config's heads): {why}")
        return  # one record speaks for the model's heads


def check_cp(plan: Plan) -> Iterator[Finding]:
    """The cp rules (module docstring) on the typed plan; nothing without a cp axis."""
    if cp_size(plan) <= 1:
        if plan.dims.cp_layout is not None:
            yield warning("plan.cp_layout_unused", pointer("parallel_dims", "cp_layout"),
                          "cp_layout is set but cp_size is 1: nothing is cut over cp")
        return
    yield from _moves(plan)
    yield from _params(plan)
    yield from _attention(plan)


__all__ = ["check_cp", "config_heads_findings"]
