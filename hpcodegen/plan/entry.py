"""The contract rule on entries as JSON, FQN helpers and the generated code's identifiers
(pure).

What an entry *means* (boundary-ness, its outputs' order, which deferred biases are
partial, whether it leaves the sequence sharded) is read from the typed
:class:`~hpcodegen.plan.types.PlanEntry` only. The contract rule compares two entries as
the meta writes them (verify reads them so before the codec parsed the meta; generate
gives it its draft entries through the codec's writer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Both naming generations of the generated-code identifiers (decisions.md, item 1).
FORM_MARKERS: tuple[str, ...] = ("_hp_boundary_form", "_hyper_boundary_form")
COMPUTE_ATTRS: tuple[str, ...] = ("__hp_compute__", "__hyper_compute__")
ENTRYPOINTS: tuple[str, ...] = ("hp_parallelize", "hyper_parallelize")
TP_FORM_MARKER = "tp_collective"
TOGGLE_FORM_MARKER = "toggle"

TRANSITION_FIELDS: tuple[str, ...] = ("in_src", "in_dst", "out_src", "out_dst")
#: Injection fields naming a callable by ``_target_`` (the runtime imports them through an
#: allowlist; inspect-plan lists them as opaque communication).
INJECTED_CALLABLES: tuple[str, ...] = ("local_compute_fn", "inner_wrapper")


def contract_differences(entry: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    """The fields two entries of one class declare differently, ``params`` and
    ``partial_grad_params`` (per parameter, synchronised by the runtime) aside (sorted).

    One class has one generated forward, so every FQN of it must carry the same contract:
    ``generate`` refuses to freeze a plan where this is non-empty and verify's ``plan`` check
    rejects such an artifact, by this one rule (docs/design.md). A field one entry lacks
    differs from any value the other gives it. Two entries that both pass every value
    through (:func:`passes_through`) have the same forward whatever their placements.
    """
    keys = sorted((set(entry) | set(other)) - {"params", "partial_grad_params"})
    diff = [k for k in keys if entry.get(k, _ABSENT) != other.get(k, _ABSENT)]
    if diff and passes_through(entry) and passes_through(other):
        # no collective either way (a norm on R here, on S(1) there): one forward
        diff = [k for k in diff if k not in TRANSITION_FIELDS]
    return diff


def passes_through(entry: Mapping[str, Any]) -> bool:
    """Every input and output the entry declares keeps its placement (``src == dst``):
    its boundary moves no data, whatever the placement."""
    for side in ("in", "out"):
        src, dst = entry.get(f"{side}_src") or {}, entry.get(f"{side}_dst") or {}
        if not isinstance(src, Mapping) or not isinstance(dst, Mapping) or set(src) != set(dst):
            return False
        if any(src[name] != dst[name] for name in src):
            return False
    return True


_ABSENT = object()


def takes_token_ids(cls: str | None) -> bool:
    """The boundary's class is a token embedding (its name ends in ``Embedding``, as
    ``nn.Embedding`` and HF's ``*Embedding`` classes): its input is integer token ids, with
    no gradient, and its output is the model's first activation."""
    return bool(cls) and cls.endswith("Embedding")


def join_fqn(prefix: str, name: str) -> str:
    """``a.b`` + ``c`` -> ``a.b.c``; either side may be empty (the root)."""
    return f"{prefix}.{name}" if prefix and name else prefix or name


def fqn_depth(fqn: str) -> int:
    """Nesting depth of a module FQN (the root is 0); boundaries install deepest first."""
    return 0 if not fqn else fqn.count(".") + 1
