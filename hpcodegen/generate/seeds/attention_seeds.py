"""Attentions the module tree leaves whole that one traced forward shows are self-attentions.

:mod:`hpcodegen.generate.seeds.seeds` splits an attention by heads when its Linears carry
transformers' names (``q_proj``, ...) and its class cannot take a second stream of keys and
values. Two kinds it must leave whole are still plain self-attentions in the model's own
forward (:class:`hpcodegen.tracer.dataflow.Flow`):

* a class that *can* take keys and values from a second input (BART-style attentions serve
  self- and cross-attention) but is handed none by this model (BioGPT, XGLM, TrOCR);
* projections under other names (CTRL's ``Wq``/``Wk``/``Wv``/``dense``), found by what the
  forward does: three Linears each applied to a forward input, one Linear applied to none
  mapping back to their width; each input read is a boundary input (CTRL passes the same
  states as ``v``, ``k`` and ``q``: each one's gradient is reduced over tp).

* the projections in two sibling modules (BERT-style: ``self.query``/``key``/``value`` in
  one, ``output.dense`` with the residual and norm after it in the other, GIT's): three
  Linears under one module applied to the very tensor that module was handed, one more
  called after them mapping back to that width, nothing else but norms. The output
  projection's module adds the residual, so no region can hold them: each projection is
  its own boundary (gathered / split input), the core replicated.

The first two are split by heads only when it runs on one rank's heads
(:func:`~hpcodegen.generate.seeds.head_check.runs_on_heads`), dividing the width attributes its
forward sizes the heads' output by where the head counts alone do not suffice; one whose
forward needs every head (TrOCR's reshape to its input's width) gets each projection as its
own boundary instead (gathered / split input, the core whole, exact whatever it computes).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from hpcodegen.generate.seeds.seeds import SEED_RULE, is_linear, self_calls_on_params
from hpcodegen.generate.sources.hf_plan import Assignment
from hpcodegen.generate.sources.styles import Kind
from hpcodegen.tracer.dataflow import Flow


def outside(fqn: str, taken: Collection[str]) -> bool:
    """Whether no module of ``taken`` is at, inside or above ``fqn``."""
    return not any(t == fqn or fqn.startswith(f"{t}.") or t.startswith(f"{fqn}.")
                   for t in taken)


def may_be_attention(module: Any) -> bool:
    """Whether to record a module's call for a replay: it holds three Linears or more."""
    return sum(1 for c in module.children() if is_linear(c)) >= 3


def forward_inputs_read(source: str) -> dict[str, str]:
    """``{child: forward parameter}`` for each ``self.<child>(<param>)`` call of a forward
    on one of its own parameters (``self.Wq(q)`` in ``forward(self, v, k, q, ...)``), the
    first such call of each child (:func:`~.seeds.self_calls_on_params`)."""
    found: dict[str, str] = {}
    for child, param, _position in self_calls_on_params(source):
        found.setdefault(child, param)
    return found


def reader_styles(module: Any, kids: Mapping[str, Any], source: str
                  ) -> tuple[dict[str, Kind], list[str]] | None:
    """Megatron's styles for an attention found by its forward (module docstring): three
    Linears on forward inputs colwise, the one other Linear rowwise; and the inputs they
    read. None when the module holds anything else with parameters."""
    from hpcodegen.generate.seeds.seeds import head_counts

    held = {n for n, m in kids.items() if any(True for _ in m.parameters())}
    reads = forward_inputs_read(source)
    cols = sorted(n for n in held if n in reads)
    rows = sorted(held - set(cols))
    if (len(cols) != 3 or len(rows) != 1 or not all(is_linear(kids[n]) for n in held)
            or any(True for _ in module.parameters(recurse=False)) or not head_counts(module)):
        return None
    width, out = kids[cols[0]].in_features, kids[rows[0]]
    if not all(kids[n].in_features == width and kids[n].out_features == out.in_features
               for n in cols) or out.out_features != width:
        return None
    return ({**{n: Kind.COLWISE for n in cols}, rows[0]: Kind.ROWWISE},
            sorted({reads[n] for n in cols}))


def split_attention_styles(fqn: str, modules: Mapping[str, Any], flow: Flow
                           ) -> dict[str, Kind] | None:
    """Each projection its own boundary for an attention whose projections live in two
    sibling modules (module docstring), keyed by their path under ``fqn``; else None."""
    from hpcodegen.tracer.norms import is_norm

    prefix = f"{fqn}."
    inner = {n[len(prefix):]: m for n, m in modules.items()
             if n.startswith(prefix) and any(True for _ in m.parameters(recurse=False))}
    linears = {n for n, m in inner.items() if is_linear(m)}
    given = flow.first_input.get(fqn)
    readers = sorted(n for n in linears if given is not None
                     and flow.first_input.get(prefix + n) is given)
    rest = sorted(linears - set(readers))
    if (len(readers) != 3 or len(rest) != 1 or "." not in rest[0]
            or any(not is_norm(m) for n, m in inner.items() if n not in linears)
            or {r.split(".")[0] for r in readers} == {rest[0].split(".")[0]}):
        return None
    order = {n: i for i, n in enumerate(flow.order)}
    out, width = inner[rest[0]], inner[readers[0]].in_features
    if not all(prefix + n in order for n in linears) or any(
            order[prefix + r] > order[prefix + rest[0]] or inner[r].in_features != width
            or inner[r].out_features != out.in_features for r in readers) \
            or out.out_features != width:
        return None
    return {**{r: Kind.COLWISE_GATHER for r in readers}, rest[0]: Kind.ROWWISE_SPLIT}


def split_attentions(modules: Mapping[str, Any], flow: Flow, taken: Collection[str]
                     ) -> dict[str, Assignment]:
    """Assignments for every attention split over two sibling modules, outermost first,
    none at, inside or above ``taken``."""
    out: dict[str, Assignment] = {}
    for fqn in flow.order:
        if not outside(fqn, [*taken, *(f.rsplit(".", 1)[0] for f in out)]):
            continue
        for name, kind in (split_attention_styles(fqn, modules, flow) or {}).items():
            out[f"{fqn}.{name}"] = Assignment(f"{fqn}.{name}", kind, 1, kind.value, SEED_RULE)
    return out


def attention_by_use(modules: Mapping[str, Any], flow: Flow, taken: Collection[str]
                     ) -> tuple[dict[str, Assignment], dict[str, list[str]],
                                dict[str, list[str]]]:
    """Self-attentions found by use (module docstring): their assignments, the width
    attributes to divide and the other inputs their projections read, per attention."""
    import inspect

    from hpcodegen.generate.seeds.head_check import runs_on_heads, smallest_split, width_attrs
    from hpcodegen.generate.seeds.module_facts import forward_source, fused_blocks, head_count_attrs
    from hpcodegen.generate.seeds.seeds import CROSS_INPUTS, attention_styles, children, head_counts

    out: dict[str, Assignment] = {}
    divide: dict[str, list[str]] = {}
    inputs: dict[str, list[str]] = {}
    for fqn, call in flow.calls.items():
        module, source = modules[fqn], forward_source(modules[fqn])
        if (not outside(fqn, taken) or set(CROSS_INPUTS) & flow.tensor_args.get(fqn, set())
                or "config.num_" in source or fused_blocks(module) != 1):
            continue
        kids, read = children(modules, fqn), []
        styles, heads = attention_styles(module, kids), head_counts(module)
        if styles is None and (found := reader_styles(module, kids, source)) is not None:
            styles, read = found
        t = smallest_split(heads[0], heads[1]) if heads else None
        if styles is None or heads is None or t is None:
            continue
        attrs, extra = head_count_attrs(module), []
        verdict = runs_on_heads(module, styles, attrs, call, t)
        if verdict is False:
            extra = [w for w in width_attrs(module, heads[0] * heads[2], source)
                     if w not in attrs]
            verdict = bool(extra) and runs_on_heads(module, styles, [*attrs, *extra], call, t)
        if verdict is None:
            continue
        if not verdict:  # the core needs every head: each projection its own boundary
            styles = {n: Kind.COLWISE_GATHER if k is Kind.COLWISE else Kind.ROWWISE_SPLIT
                      for n, k in styles.items()}
            extra = []
        out.update({f"{fqn}.{n}": Assignment(f"{fqn}.{n}", k, 1, k.value, SEED_RULE)
                    for n, k in styles.items()})
        divide[fqn] = extra
        if verdict:
            first = next(iter(inspect.signature(module.forward).parameters), None)
            inputs[fqn] = [n for n in read if n != first]
    return out, divide, inputs


