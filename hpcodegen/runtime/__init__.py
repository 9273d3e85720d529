"""Execute a frozen plan on a torch DTensor mesh.

Importing this package is cheap: torch loads only when :func:`parallelize_from_generated`
(or another runtime helper) is first used. Generated modeling modules import
``hpcodegen.runtime.identity`` for their class-level defaults.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MeshContext", "parallelize_from_generated"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hpcodegen.runtime import api

        return getattr(api, name)
    raise AttributeError(f"module 'hpcodegen.runtime' has no attribute {name!r}")
