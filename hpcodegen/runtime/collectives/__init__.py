"""Lowered tp collectives on local tensors, with DTensor's autograd.

A ``tp_collective`` boundary runs bare collectives on plain local tensors instead of
``DTensor.redistribute``. To stay exact, each one has the backward DTensor would run: the
forward op comes from ``Transition.op`` and the backward from ``Transition.grad_steps``
(``hpcodegen.plan.classify.grad_steps``, the one rule; see docs/design.md "Autograd of
lowered collectives").

One job per module, in the order a call goes through them:

* :mod:`.comm`: :class:`~.comm.Comm`, one process group resolved once (its size, rank and
  the option objects the ``ProcessGroup`` methods take);
* :mod:`.local`: the local-tensor walker (DTensors unwrapped, tuples walked) and the
  ``torch.compile`` switch;
* :mod:`.ops`: the four collectives on one local tensor (all_gather, all_reduce,
  reduce_scatter, the local chunk): the ``ProcessGroup`` methods eagerly, the functional
  collectives under ``torch.compile``;
* :mod:`.autograd`: a forward op and its backward steps as one differentiable callable,
  without a Python ``autograd.Function`` where a C++ op has the same gradient;
* :mod:`.traced`: the compiled-model twins (closures over constants only, for dynamo);
* :mod:`.transition`: one planned ``Transition`` as that callable, eager and traced;
* :mod:`.matching`: :class:`~.matching.TPOps`, the ``self._hp_tp`` of a generated boundary:
  name-free calls matched to the boundary's transitions.

The names below are re-exported for callers outside this package.
"""

from hpcodegen.runtime.collectives.autograd import apply_lowered
from hpcodegen.runtime.collectives.comm import Comm
from hpcodegen.runtime.collectives.local import compiling, map_local_tensors
from hpcodegen.runtime.collectives.matching import TPOps
from hpcodegen.runtime.collectives.ops import gather, local_chunk, reduce, scatter, step_fn
from hpcodegen.runtime.collectives.traced import traced_step
from hpcodegen.runtime.collectives.transition import lowered_fn

__all__ = ["Comm", "TPOps", "apply_lowered", "compiling", "gather", "local_chunk",
           "lowered_fn", "map_local_tensors", "reduce", "scatter", "step_fn", "traced_step"]
