"""The one meta-device tracer: build a model with no memory, run one forward, watch it.

Several questions about a model can only be answered by running it: the size of every
tensor a collective moves, whether code outside the plan's modules survives sequence
sharding, which dim holds the tokens, what the forward does to the logits after the head.
Each is one forward of the model on the meta device (real structure, no weights, no
memory), watched by module hooks and, where single operations matter, a
``TorchDispatchMode``. torch and transformers are imported inside the functions only; the
pure core (``plan``, ``checks``, ``verify``, ``inspect`` without ``--hf-config``) never
imports this package.

* :mod:`.model`: build a meta model from an HF config, eager attention, experts run
  shape-only, one forward on meta (or fake) token ids;
* :mod:`.hooks`: module hooks that name a forward's arguments, pick its outputs by
  position and record tensor shapes (what every caller's hooks share);
* :mod:`.ops`: the dispatch mode that follows the tensors derived from a seed through
  every aten op and asks a judge about each op that reads one; aten's op tags;
* :mod:`.loss_parallel`: the loss-parallel rule on a built model (the head's logits are
  only ever touched entry by entry; :mod:`hpcodegen.plan.loss_parallel` is its pure half).
* :mod:`.attention`: transformers' attention interface watched (which modules call it,
  their K/V shapes and keyword arguments; the model's own kernel still runs).

Its other users: ``inspect-plan --hf-config`` (:mod:`hpcodegen.inspect.trace`, bytes per
collective), ``generate --sp`` (:mod:`hpcodegen.generate.checks.sp_check`, the sharded-sequence
run; :mod:`hpcodegen.generate.layouts.token_dims`, which dim holds the tokens), ``generate --cp``
(:mod:`hpcodegen.generate.layouts.cp_probe`: attention calls, token mixing outside them, each
boundary's sequence dim) and generate's plan cost (:mod:`hpcodegen.generate.layouts.cost`).
"""
