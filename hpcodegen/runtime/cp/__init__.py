"""Context parallelism at run time: the sequence cut over cp, attention over all of it.

* :mod:`.context`: installed by ``parallelize_from_generated`` on a live cp axis: the model's
  own config naming its CP attention, the root forward's batch view;
* :mod:`.attention`: K/V all-gathered over cp at their kv-head count (the backward
  reduce-scatters), the mask rows of this rank's queries at global positions;
* :mod:`.ulysses`: the Ulysses exchange (all-to-all of Q/K/V for a head shard of the whole
  sequence, and of the output back) that ``*_ulysses`` / ``*_hybrid`` run around the kernel;
* :mod:`.wrappers`: the ``inner_wrapper`` factories (``sdpa_hf``, ``sdpa_qkv``, ``eager_hf``,
  and their ``_ulysses`` / ``_hybrid`` forms);
* :mod:`.batch`: the data helper for training scripts (:func:`shard_batch`).

docs/cp.md describes the method and the layouts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CPBatch", "all_reduce_gradients", "cp_state", "shard_batch"]

_HOMES = {"CPBatch": "batch", "all_reduce_gradients": "batch", "shard_batch": "batch",
          "cp_state": "context"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        from importlib import import_module

        return getattr(import_module(f"hpcodegen.runtime.cp.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'hpcodegen.runtime.cp' has no attribute {name!r}")
