"""Ulysses and hybrid context parallelism exact on real gloo ranks: logits (put back in
order) and every gradient within 1e-5 of the unsharded model, losses equal.

One spawn of 4 ranks runs every case: ``cp 2 x tp 2`` Ulysses with and without ``--sp`` (one
loss-parallel), where the kv heads (2) are fewer than tp*cp (4): each tp rank holds one kv
head and each cp rank takes its copy of it (replicated exactly); ``cp 4`` Ulysses on
Mistral (a sliding window of 3, shorter than every rank's chunk) and Gemma 2 (attention
softcapping on its eager kernel, alternating sliding/full layers), again with 2 kv heads
over 4 ranks; the hybrid (2 ranks of all-to-all inside 2 of all-gather); both layouts;
padding, packed documents, a length the layout does not divide.
"""

from __future__ import annotations

import pytest
from cp_paths import CONFIGS
from cp_workers import assert_cp_parity, cp_parity_cases

pytestmark = [pytest.mark.gloo, pytest.mark.slow]

TOL = 1e-5
SEQ = 32
#: (config, tp, cp, sp, layout, loss parallel, method, ulysses, cases)
PLAN = [
    ("llama_gqa", 2, 2, True, None, False, "ulysses", None, ("padding", "packed")),
    ("llama_gqa", 2, 2, False, "contiguous", True, "ulysses", None, ("plain",)),
    ("mistral_swa", 1, 4, False, None, False, "ulysses", None, ("plain", "packed", "odd")),
    ("gemma2_softcap", 1, 4, False, "contiguous", False, "ulysses", None, ("padding",)),
    ("gemma2_softcap", 1, 4, False, None, False, "hybrid", 2, ("packed",)),
    ("mistral_swa", 1, 4, False, None, False, "hybrid", 2, ("padding", "odd")),
]


def _cases(cp_artifact) -> list[tuple]:
    out = []
    for config, tp, cp, sp, layout, lp, method, ulysses, cases in PLAN:
        art = cp_artifact(config, tp=tp, cp=cp, sp=sp, layout=layout, loss_parallel=lp,
                          method=method, ulysses=ulysses)
        for case in cases:
            out.append((f"{art.name}:{case}", str(art), str(CONFIGS / config), cp, 4 // cp,
                        case, SEQ))
    return out


@pytest.mark.timeout(480)
def test_ulysses_and_hybrid_are_exact(cp_artifact, gloo) -> None:
    cases = _cases(cp_artifact)
    results = gloo(4, cp_parity_cases, cases)
    assert_cp_parity(results, [c[0] for c in cases], TOL)
