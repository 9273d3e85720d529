"""Derive a plan's placements by propagation instead of matching them by rules.

The plan check (:mod:`hpcodegen.checks.plan_derived`) judges a meta with rules written beside
the model; the truth is what the forward and backward compute. With a model config,
:func:`hpcodegen.derive.propagate.derive` runs the model's forward and backward once on
the meta device, over a fake process group of the plan's mesh sizes, with every planned
parameter a DTensor of its declared placements and every boundary's inputs redistributed as
declared. DTensor's own sharding propagation then says, op by op, what each boundary
outputs (``Partial`` included), which gradients are partial, and where the local code the
runtime runs would need communication the plan does not perform.

* :mod:`.record`: what a derivation found (pure data, no torch);
* :mod:`.world`: the fake process group and the mesh of the live axes (size > 1);
* :mod:`.propagate`: the symbolic run (torch);
* :mod:`hpcodegen.checks.derived`: the comparison with what the meta declares (pure).
"""
