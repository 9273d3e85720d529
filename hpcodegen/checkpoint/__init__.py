"""Checkpoints of tensor-parallel models: sharded load, DCP save/resume, HF export, clipping.

* :func:`materialize` (with :func:`parameters_on_meta`): each rank reads only its shards
  of an HF safetensors checkpoint.
* :func:`save` / :func:`resume`: ``torch.distributed.checkpoint`` at any tp and dp.
* :func:`export_hf`: a saved checkpoint back to ``config.json`` + safetensors.
* :func:`clip_grad_norm_`: clipping by the unsharded model's global norm.

All of them take a :class:`ShardLayout` (global shapes and plan placements per parameter;
``hpcodegen.launch.setup()`` returns one). Importing this package loads no torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShardLayout", "clip_grad_norm_", "export_hf", "load_untrusted", "materialize",
           "parameters_on_meta", "resume", "save", "total_grad_norm"]

_HOMES = {"ShardLayout": "layout", "clip_grad_norm_": "clip", "total_grad_norm": "clip",
          "export_hf": "export", "materialize": "shard_load",
          "parameters_on_meta": "shard_load", "resume": "dcp_io", "save": "dcp_io",
          "load_untrusted": "dcp_safe"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        from importlib import import_module

        return getattr(import_module(f"hpcodegen.checkpoint.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'hpcodegen.checkpoint' has no attribute {name!r}")
