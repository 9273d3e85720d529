"""The rule a row-sharded token embedding must satisfy for the runtime to execute it (pure).

The runtime runs every token embedding whose ``weight`` is ``Shard(0)`` on tp as a masked
lookup of its rank's vocabulary rows (:mod:`hpcodegen.runtime.embedding`): each rank's
output holds only the rows of its ids, a ``Partial(sum)``. That is exact only when the
embedding is a boundary of its own whose first output is declared ``P(sum)`` (its output
op then reduces it). A plan that shards the rows any other way (the weight planned under a
parent entry, no boundary, a replicated output) would run and give wrong numbers, so
verify refuses it: the plan check for classes named ``*Embedding``, the model check (with
``--hf-config``) for every ``nn.Embedding`` instance whatever its class.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from hpcodegen.errors import Finding, error, pointer
from hpcodegen.placement import Partial, Shard, parse_placement
from hpcodegen.plan.entry import is_boundary, join_fqn, param_plan


def _tp(named: Any) -> Any:
    text = named.get("tp") if isinstance(named, Mapping) else None
    try:
        return parse_placement(text) if isinstance(text, str) else None
    except ValueError:
        return None


def vocab_parallel_findings(meta: Mapping[str, Any], embeddings: Iterable[str],
                            check: str) -> Iterator[Finding]:
    """One error per token embedding (module FQNs in ``embeddings``) whose weight is
    row-sharded on tp but whose partial lookup no boundary of its own reduces."""
    wanted = {f"{fqn}.weight" if fqn else "weight": fqn for fqn in embeddings}
    owners = _possible_owners(wanted)
    plan = param_plan(meta)
    for entry_fqn, entry in plan.items():  # a malformed entry is the schema check's finding
        if entry_fqn not in owners:
            continue  # plans none of the wanted parameters (most entries: one set lookup)
        params = entry.get("params") if isinstance(entry, Mapping) else None
        for rel, named in params.items() if isinstance(params, Mapping) else ():
            param = join_fqn(entry_fqn, rel)
            module = wanted.get(param)
            if module is not None and _tp(named) == Shard(0):
                yield from _check_one(plan, entry_fqn, param, module, check)


def _possible_owners(params: Iterable[str]) -> set[str]:
    """Every entry FQN that can plan one of ``params``: each dotted prefix of it, the root
    ``""`` and the parameter itself (:func:`join_fqn` of an entry and a relative name)."""
    out: set[str] = set()
    for param in params:
        parts = param.split(".")
        out.update(".".join(parts[:depth]) for depth in range(len(parts) + 1))
    return out


def _check_one(plan: Mapping[str, Any], entry_fqn: str, param: str, module: str,
               check: str) -> Iterator[Finding]:
    where = pointer("param_plan", entry_fqn, "params")
    if entry_fqn != module:
        yield error(f"{check}.vocab_parallel_owner", where,
                    f"{param} is row-sharded (vocab-parallel) but planned under "
                    f"{entry_fqn or '<root>'}: its lookup is partial per rank and only a "
                    f"boundary on {module} itself reduces it",
                    expected=f"a param_plan entry {module!r} holding 'weight'")
        return
    entry = plan[entry_fqn]
    names = entry.get("out_names")
    outs = entry.get("out_src")
    if not isinstance(names, list) or not names:
        names = list(outs) if isinstance(outs, Mapping) else []
    first = outs.get(names[0]) if names and isinstance(outs, Mapping) \
        and isinstance(names[0], str) else None
    if not is_boundary(entry) or not isinstance(_tp(first), Partial):
        yield error(f"{check}.vocab_parallel_output", pointer("param_plan", module),
                    f"{module} looks up row-sharded vocabulary (weight S(0)): each rank's "
                    "output is a partial sum, so its first output must be declared "
                    "out_src P(sum) (and reduced by out_dst)",
                    expected='out_src {"<output>": {"tp": "P(sum)"}}')
