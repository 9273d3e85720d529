"""Frozen-plan reading, classification and prediction (pure: no torch, not even inside a
function; the half of a rule that needs a built model lives at the edge, such as the
loss-parallel rule's in :mod:`hpcodegen.tracer.loss_parallel`)."""
