"""The install-time loss-parallel rule: what ``generate --loss-parallel`` and verify refuse,
the runtime refuses too, before anything is sharded or any collective runs.

A hand-edited or foreign meta may set ``parallel_dims.loss_parallel`` (and leave the head's
logits ``S(-1)``) on a model whose forward reads the vocabulary as a whole after the head;
the runtime would run it and return other logits than the unsharded model. So
:func:`check_loss_parallel_install` applies :func:`hpcodegen.tracer.loss_parallel.model_findings`
(the one rule) to the live model's structure: errors become a :class:`PlanError` with
verify's reasons (codes ``runtime.loss_parallel_*``), a forward the meta device cannot run is
a warning, as it is a note at generate.

The forward needs a model it may change (eager attention, stubbed experts) and no weights,
so it runs on :func:`meta_twin`, a copy of the module tree whose parameters and buffers are
empty meta tensors: the live model is never touched, and no weight is copied. Without the
flag only the head's placement is read, on the live model (no forward, no copy).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from hpcodegen.errors import PlanError, Severity
from hpcodegen.plan.types import Plan


def meta_twin(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are meta tensors of their shape
    (tied parameters stay tied; nothing is allocated on a device).

    The copy's memo maps every parameter and buffer to its meta stand-in before
    ``deepcopy`` walks the tree, so weights are never copied.
    """
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"),
                                   requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def check_loss_parallel_install(model: nn.Module, plan: Plan, ours: bool) -> None:
    """Raise a PlanError where loss parallelism (or its absence) would run inexactly;
    ``ours``: hpcodegen wrote the meta (a foreign one's undeclared head is a warning)."""
    from hpcodegen.plan.loss_parallel import forward_needed
    from hpcodegen.tracer.loss_parallel import model_findings

    target = model
    if forward_needed(plan):
        try:
            target = meta_twin(model)
        except Exception as exc:  # an attribute deepcopy refuses (a lock, a process group)
            warnings.warn(f"parallel_dims.loss_parallel: what {type(model).__name__}.forward "
                          "does to the logits after the head was not checked (the model "
                          f"cannot be copied to the meta device: {type(exc).__name__}); "
                          "launch --check-parity verifies it", UserWarning, stacklevel=3)
            return
    findings = model_findings(target, plan, "runtime", ours)
    errors = [f for f in findings if f.severity is Severity.ERROR]
    if errors:
        raise PlanError(errors)
    for note in findings:
        warnings.warn(note.message, UserWarning, stacklevel=3)
