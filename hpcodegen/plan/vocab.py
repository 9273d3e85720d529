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

from collections.abc import Iterable, Iterator

from hpcodegen.errors import Finding, error, pointer
from hpcodegen.placement import REPLICATE, Partial, Shard
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import Plan


def vocab_parallel_findings(plan: Plan, embeddings: Iterable[str],
                            check: str) -> Iterator[Finding]:
    """One error per token embedding (module FQNs in ``embeddings``) whose weight is
    row-sharded on tp but whose partial lookup no boundary of its own reduces."""
    wanted = {f"{fqn}.weight" if fqn else "weight": fqn for fqn in embeddings}
    for param in plan.parameters():
        module = wanted.get(param.fqn)
        if module is not None and param.placements.get("tp") == Shard(0):
            yield from _check_one(plan, param.entry, param.fqn, module, check)


def _check_one(plan: Plan, entry_fqn: str, param: str, module: str,
               check: str) -> Iterator[Finding]:
    where = pointer("param_plan", entry_fqn, "params")
    if entry_fqn != module:
        yield error(f"{check}.vocab_parallel_owner", where,
                    f"{param} is row-sharded (vocab-parallel) but planned under "
                    f"{entry_fqn or '<root>'}: its lookup is partial per rank and only a "
                    f"boundary on {module} itself reduces it",
                    expected=f"a param_plan entry {module!r} holding 'weight'")
        return
    entry = plan.entries[entry_fqn]
    names = entry.output_names
    first = (entry.out_src or EMPTY).get(names[0]) if names else None
    if not entry.boundary or not isinstance((first or EMPTY).get("tp", REPLICATE), Partial):
        yield error(f"{check}.vocab_parallel_output", pointer("param_plan", module),
                    f"{module} looks up row-sharded vocabulary (weight S(0)): each rank's "
                    "output is a partial sum, so its first output must be declared "
                    "out_src P(sum) (and reduced by out_dst)",
                    expected='out_src {"<output>": {"tp": "P(sum)"}}')
