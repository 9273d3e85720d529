"""The gradient rule for a boundary nested in a region whose output is partial over tp.

Mamba's mixer is such a region (channels split, ``out_proj`` partial); its ``x_proj`` is a
rowwise Linear nested in it, whose own boundary all-reduces its partial output. That value
feeds the channel-split scan, so its gradient is partial too: the backward all-reduces it
(Megatron's g followed by f). Elsewhere an output all_reduce backs off as nothing.
"""

from __future__ import annotations

from typing import Any

from hpcodegen.placement import parse_placement
from hpcodegen.plan.classify import classify_plan, enclosed_in_partial, grad_steps
from hpcodegen.plan.codec import entries_from_json, entry_from_json, plan_from_meta
from hpcodegen.plan.volume import transition_volume

REGION = {"params": {"in_proj.weight": {"tp": "S(0)"}, "out_proj.weight": {"tp": "S(1)"}},
          "in_src": {"hidden_states": {"tp": "R"}}, "in_dst": {"hidden_states": {"tp": "R"}},
          "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "R"}},
          "out_names": ["output"], "is_boundary": True}
ROWWISE = {"params": {"weight": {"tp": "S(1)"}},
           "in_src": {"input": {"tp": "S(-1)"}}, "in_dst": {"input": {"tp": "S(-1)"}},
           "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "R"}},
           "out_names": ["output"], "is_boundary": True}
GATHER = {"params": {"weight": {"tp": "S(0)"}},
          "in_src": {"input": {"tp": "S(-1)"}}, "in_dst": {"input": {"tp": "S(-1)"}},
          "out_src": {"output": {"tp": "S(-1)"}}, "out_dst": {"output": {"tp": "R"}},
          "out_names": ["output"], "is_boundary": True}


def kinds(steps: Any) -> list[tuple[str, int | None]]:
    return [(s.kind, s.dim) for s in steps]


def test_enclosed_output_gradient_is_partial() -> None:
    p = (parse_placement("P(sum)"),)
    r = (parse_placement("R"),)
    assert kinds(grad_steps("out", p, r, ("tp",), True)) == []
    assert kinds(grad_steps("out", p, r, ("tp",), True, enclosed=True)) == [("all_reduce", None)]
    s = (parse_placement("S(-1)"),)
    assert kinds(grad_steps("out", s, r, ("tp",), False, enclosed=True)) == [
        ("reduce_scatter", -1)]
    # the rule is the outputs' only: an input keeps its own (split) rule
    assert kinds(grad_steps("in", s, s, ("tp",), True, enclosed=True)) == []


def test_enclosed_in_partial_walks_ancestors_only() -> None:
    plan = entries_from_json({"m.mixer": REGION, "m.mixer.x_proj": ROWWISE,
                              "m.other.x": ROWWISE,
                              "m.params": {"params": {}, "is_boundary": False}})
    assert enclosed_in_partial("m.mixer.x_proj", plan)
    assert not enclosed_in_partial("m.mixer", plan)        # itself does not count
    assert not enclosed_in_partial("m.other.x", plan)
    assert not enclosed_in_partial("m.params.y", plan)     # a params-only entry is no region
    assert not enclosed_in_partial("", plan)


def test_classify_plan_nested_rowwise_all_reduces_its_gradient() -> None:
    meta = {"mesh_dim_names": ["tp"],
            "param_plan": {"b.0.mixer": REGION, "b.0.mixer.x_proj": ROWWISE,
                           "b.1.mixer": REGION, "b.1.mixer.g": GATHER, "top.x_proj": ROWWISE}}
    forms = classify_plan(plan_from_meta(meta))
    nested = forms["b.0.mixer.x_proj"].outputs[0]
    assert nested.enclosed and kinds(nested.grad_steps) == [("all_reduce", None)]
    assert kinds(forms["b.1.mixer.g"].outputs[0].grad_steps) == [("reduce_scatter", -1)]
    # the same entry outside a region keeps the plain rule (memo keyed by nesting too)
    alone = forms["top.x_proj"].outputs[0]
    assert not alone.enclosed and kinds(alone.grad_steps) == []
    # the region's own output all_reduce backs off as nothing
    assert kinds(forms["b.0.mixer"].outputs[0].grad_steps) == []
    # inspect's volume prediction walks the same backward
    ops = transition_volume(nested, entry_from_json("b.0.mixer.x_proj", ROWWISE), ("tp",),
                            {"tp": 2}, ((2, 8, 36), None), 4)
    assert [(o.direction, o.kind) for o in ops] == [("forward", "all_reduce"),
                                                   ("backward", "all_reduce")]
