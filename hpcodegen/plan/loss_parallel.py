"""Loss parallelism: when a head's logits may stay vocab-sharded, exactly (one rule).

With loss parallelism (``parallel_dims.loss_parallel``) the output head's logits stay as
each rank's slice of the vocabulary, and the model's forward runs on that slice whatever it
does to the logits after the head. That is exact only when every step is elementwise per
vocabulary entry (Gemma-2's soft-capping ``tanh(x / c) * c``, Cohere's ``logit_scale``,
Granite's ``logits_scaling``, a dtype cast). A step that reads the vocabulary as a whole (a
softmax, a slice to ``unpadded_vocab_size``, a full-vocab bias, writing global token ids as
in Chameleon's ``logits[:, :, image_tokens] = min``) would compute something else on a
slice, silently.

So the plan must leave the head's output ``S(-1)`` (a colwise head; a rowwise head already
reduces its output, there is nothing to keep sharded), and one forward of the meta model is
watched from the head's output onwards: every aten op on a tensor derived from the head
output must act on each vocabulary entry on its own (torch's ``pointwise`` op tag, or a
named untagged exception), with no other operand spanning the vocabulary, and the
``logits`` the model returns must derive from the head.

The rule has two halves, run by three callers with their own code prefix (``generate.``,
``model.``, ``runtime.``), so that a hand-edited or foreign meta cannot bypass what
``generate --loss-parallel`` refuses:

* this module (pure: no torch): :func:`plan_findings`, the ``plan`` check (hence also the
  runtime's install-time checks): the flag needs a tp axis of size > 1 and a boundary that
  leaves its output vocab-sharded; and who calls (:class:`Caller`), :func:`declared`,
  :func:`forward_needed`;
* :mod:`hpcodegen.tracer.loss_parallel` (a built model, lazy torch): ``check_loss_parallel``
  (``generate --loss-parallel``) and ``model_findings`` (verify's ``model`` check and
  ``parallelize_from_generated``), which also refuses the converse, a head whose output
  the plan leaves vocab-sharded without the flag: the model would return a slice of the
  logits as if it were all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcodegen.errors import Finding, error, pointer, warning
from hpcodegen.plan.types import TP, Plan

#: Where findings about the flag point: ``/parallel_dims/loss_parallel``
FLAG = pointer("parallel_dims", "loss_parallel")


@dataclass(frozen=True)
class Caller:
    """Who applies the rule: its code prefix, how it names the flag, where its findings
    point (None: at the head's FQN) and what it suggests."""

    check: str
    flag: str
    where: str | None
    hint: str


#: ``generate --loss-parallel``
GENERATE = Caller("generate", "--loss-parallel", None, "generate without --loss-parallel")


def meta_caller(check: str) -> Caller:
    """verify's ``model`` check and the runtime: the flag is the meta's."""
    return Caller(check, "parallel_dims.loss_parallel", FLAG,
                  "regenerate the artifact without --loss-parallel (loss_parallel false)")


def declared(plan: Plan) -> bool:
    """``parallel_dims.loss_parallel`` is true."""
    return plan.dims.loss_parallel is True


def plan_findings(plan: Plan, check: str, ours: bool) -> list[Finding]:
    """The flag on a plan that keeps nothing vocab-sharded (pure: no model needed).

    ``loss_parallel`` needs a tp axis of size > 1 and a boundary whose weight is ``S(0)``
    and whose output stays ``S(-1)`` on tp (:meth:`~hpcodegen.plan.types.Plan.
    vocab_sharded_heads`). Otherwise the logits are whole and the flag misleads whoever
    computes the loss from it: an error in a meta hpcodegen wrote (``ours``), a warning in a
    foreign one (the existing system writes the flag from its job config whatever the mesh;
    its plan still runs exactly).
    """
    if not declared(plan):
        return []
    make = error if ours else warning
    tp = plan.dims.size(TP)
    if tp <= 1:
        return [make(f"{check}.loss_parallel_without_tp", FLAG,
                     f"loss_parallel is true but tp_size is {tp}: the logits are not split "
                     "over any axis, there is no vocab-sharded output to keep",
                     expected="tp_size > 1, or loss_parallel false",
                     hint="generate --loss-parallel only with --tp > 1")]
    if plan.entries and not plan.vocab_sharded_heads():  # (an empty plan: plan.empty)
        return [make(f"{check}.loss_parallel_no_sharded_head", FLAG,
                     "loss_parallel is true but no boundary of param_plan leaves its output "
                     "vocab-sharded (weight S(0) and output S(-1) on tp, as a colwise "
                     "lm_head): the logits are gathered whole, so a loss-parallel cross "
                     "entropy would read the full vocabulary as one rank's slice",
                     expected="an output head with weight S(0) and out_dst S(-1) on tp, or "
                              "loss_parallel false")]
    return []


def forward_needed(plan: Plan) -> bool:
    """:func:`model_findings` runs a forward: the flag is set, tp > 1 and the plan keeps an
    output vocab-sharded (else :func:`plan_findings` has said what is wrong)."""
    return declared(plan) and plan.dims.size(TP) > 1 and bool(plan.vocab_sharded_heads())


