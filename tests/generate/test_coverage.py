"""generate and verify share the coverage rule (reference: equal to a planned key or below
it, trainable parameters deduplicated by identity), on a real tiny torch module."""

from __future__ import annotations

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.generate.checks.validate import check_coverage
from hpcodegen.plan.codec import entries_from_json
from hpcodegen.plan.coverage import is_covered, uncovered


def _tied_model():
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(8, 4)
            self.block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
            self.head = nn.Linear(4, 8, bias=False)
            self.head.weight = self.emb.weight  # tied: one parameter, two names
            self.frozen = nn.Linear(4, 4)
            self.frozen.requires_grad_(False)

    return Tiny()


def test_prefix_rule_needs_a_dot_boundary() -> None:
    planned = {"block.0", "emb.weight", ""}
    assert is_covered("block.0.weight", planned) and is_covered("emb.weight", planned)
    assert not is_covered("block.01.weight", {"block.0"})  # a prefix, but not + "."
    assert uncovered(["a.b", "ab.c", "a"], ["a"]) == ["ab.c"]


def test_generate_accepts_what_verify_accepts_and_names_the_rest() -> None:
    model = _tied_model()
    plan = {"emb": {"params": {"weight": {"tp": "S(0)"}}},
            "block": {"params": {"0": {"tp": "R"}}}}  # block.0 covers block.0.weight/.bias
    with pytest.raises(PlanError) as exc:
        check_coverage(model, entries_from_json(plan))
    # before: block.0.* and the tied head.weight were "not covered" too (exact names, aliases)
    assert {(f.code, f.where) for f in exc.value.findings} == {
        ("generate.param_not_covered", "block.1.weight"),
        ("generate.param_not_covered", "block.1.bias"),
        ("generate.param_missing", "/param_plan/block"),  # block.0 is a module, not a param
    }
    plan["block"]["params"] = {"0.weight": {"tp": "R"}, "0.bias": {"tp": "R"},
                               "1.weight": {"tp": "R"}, "1.bias": {"tp": "R"}}
    # frozen.* is not trainable; head.weight is emb.weight
    check_coverage(model, entries_from_json(plan))
