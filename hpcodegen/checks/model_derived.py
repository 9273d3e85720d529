"""What the ``model`` check derives about boundaries from the real modules (torch).

:func:`input_name_findings`: every input a boundary places must be one its forward takes
(the rule the runtime's input binder applies at install, ``runtime.unknown_input``).

:func:`leaf_form_findings`: ``nn.Linear`` and ``nn.Embedding`` boundaries: their outputs
follow from their weights. For these two torch modules the math is known, so the check
derives, from the weight's tp placement and the input's, what the output must be, and
refuses a meta that declares otherwise (a hand-edited ``lm_head`` whose row-split weight
meets a replicated input crashes at the first forward; a vocab-split embedding declared
``S(-1)`` instead of partial would be gathered as shards):

==============  ===================  ==============  ==================
module          weight on tp         input on tp     output on tp
==============  ===================  ==============  ==================
Linear [o, i]   ``S(0)`` (columns)   ``R``           ``S(-1)``
Linear          ``S(1)`` (rows)      ``S(-1)``       ``P(sum)``
Linear          ``R``                any but last    the input's
Embedding       ``S(0)`` (vocab)     ``R``           ``P(sum)``
Embedding       ``S(1)`` (hidden)    ``R``           ``S(-1)``
Embedding       ``R``                ids             the ids'
==============  ===================  ==============  ==================

Placements are compared after resolving negative dims against the tensor rank (a 3-D
activation's ``S(-1)`` is ``S(2)``). Opaque boundaries (an injected compute or wrapper)
are left to their owners.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hpcodegen.errors import Finding, error, pointer
from hpcodegen.placement import (
    REPLICATE,
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
)
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import NamedPlacement, Plan, PlanEntry

#: activations are (batch, sequence, hidden): the rank the dims of S(d) resolve against
ACTIVATION_RANK = 3


def _tp(named: NamedPlacement | None) -> Placement:
    return (named or EMPTY).get("tp", REPLICATE)


def _dim(p: Any, rank: int) -> int | None:
    return p.dim % rank if isinstance(p, Shard) and -rank <= p.dim < rank else None


def _same(a: Any, b: Any, rank: int) -> bool:
    if isinstance(a, Shard) or isinstance(b, Shard):
        return _dim(a, rank) is not None and _dim(a, rank) == _dim(b, rank)
    return type(a) is type(b) and (not isinstance(a, Partial) or a == b)


def expected_output(kind: str, weight: Any, inp: Any) -> tuple[Any, str] | None:
    """The output placement of a Linear/Embedding, or None with no valid one (and why)."""
    last = ACTIVATION_RANK - 1
    if kind == "Linear":
        if isinstance(weight, Shard) and weight.dim % 2 == 0:
            return (Shard(last), "") if isinstance(inp, Replicate) else \
                (None, "a column-split weight needs a replicated input")
        if isinstance(weight, Shard):
            return (Partial("sum"), "") if _dim(inp, ACTIVATION_RANK) == last else \
                (None, "a row-split weight needs its input split on the last dim")
        if _dim(inp, ACTIVATION_RANK) == last:
            return None, "a whole weight cannot contract an input split on the last dim"
        return inp, ""
    if isinstance(weight, Shard) and not isinstance(inp, Replicate):
        return None, "a split embedding table needs whole (replicated) token ids"
    if isinstance(weight, Shard):
        return (Partial("sum"), "") if weight.dim % 2 == 0 else (Shard(last), "")
    return (inp if isinstance(inp, Shard) else REPLICATE), ""


def leaf_form_findings(plan: Plan, modules: Mapping[str, Any]) -> Iterator[Finding]:
    """An error for every Linear/Embedding boundary whose declared output is not the one
    its weight and input make (see the module docstring)."""
    from torch import nn

    opaque = {fqn for record in plan.injections or () for fqn in record.fqns}
    for fqn, entry in plan.entries.items():
        module = modules.get(fqn)
        kind = ("Linear" if isinstance(module, nn.Linear)
                else "Embedding" if isinstance(module, nn.Embedding) else None)
        ins, outs = entry.in_dst, entry.out_src
        if kind is None or fqn in opaque or ins is None or outs is None \
                or len(ins) != 1 or len(outs) != 1:
            continue
        weight = _tp((entry.params or EMPTY).get("weight"))
        inp, (name, declared) = _tp(next(iter(ins.values()))), next(iter(outs.items()))
        out = _tp(declared)
        if isinstance(weight, StridedShard):
            continue
        want, why = expected_output(kind, weight, inp)
        if want is None or not _same(want, out, ACTIVATION_RANK):
            detail = why or f"the output is {_show(want)}"
            yield error("model.leaf_output", pointer("param_plan", fqn, "out_src", name, "tp"),
                        f"{fqn} ({kind}, weight {_show(weight)} on tp, input {_show(inp)}): "
                        f"{detail}, but the plan declares {_show(out)}",
                        expected=_show(want) if want is not None else None,
                        hint="regenerate the artifact; its placements contradict the math")


def input_name_findings(plan: Mapping[str, PlanEntry], modules: Mapping[str, Any],
                        replaced: set[str]) -> Iterator[Finding]:
    """Boundary inputs the module's forward does not take (and no ``**kwargs`` catches):
    the runtime's binder refuses them at install; refused here, by the same rule, first."""
    import inspect

    for fqn, entry in plan.items():
        module = modules.get(fqn)
        if module is None or fqn in replaced or not entry.boundary:
            continue
        names = sorted({*(entry.in_src or EMPTY), *(entry.in_dst or EMPTY)})
        try:
            params = list(inspect.signature(type(module).forward).parameters.values())[1:]
        except (TypeError, ValueError):
            continue
        known = {p.name for p in params}
        unknown = [n for n in names if n not in known]
        if not unknown or len(names) == 1 or any(p.kind == p.VAR_KEYWORD for p in params):
            continue
        yield error("model.unknown_input", pointer("param_plan", fqn, "in_src", unknown[0]),
                    f"{fqn} ({type(module).__name__}): inputs {unknown} are not parameters "
                    "of its forward, so the runtime cannot bind them",
                    expected=", ".join(sorted(known)) or "no parameters")


def _show(p: Any) -> str:
    return str(p) if p is not None else "none"
