"""Execute a frozen plan on a torch DTensor mesh.

Importing this package is cheap: torch loads only when :class:`Artifact` builds or
parallelizes a model (or another runtime helper is first used). Generated modeling modules import
``hpcodegen.runtime.identity`` for their class-level defaults.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Artifact", "MeshContext", "attach_optimizer", "generated_model_class",
           "import_generated_module",
           "import_verified_module", "load_verified_meta", "parallel_state",
           "parallelize_from_generated"]

_HOMES = {"Artifact": "artifact", "MeshContext": "mesh", "parallel_state": "shards",
          "attach_optimizer": "state_dict",
          "parallelize_from_generated": "api", "load_verified_meta": "api",
          "generated_model_class": "loader", "import_generated_module": "loader",
          "import_verified_module": "loader"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        from importlib import import_module

        return getattr(import_module(f"hpcodegen.runtime.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'hpcodegen.runtime' has no attribute {name!r}")
