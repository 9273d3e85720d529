"""hpcodegen: frozen tensor-parallel plans for HF transformers models.

The pure core (``errors``, ``placement``, ``artifact``, ``plan``, ``checks``) imports neither
torch nor transformers; ``runtime``, ``generate`` and ``launch`` load them lazily.
``hpcodegen.Artifact`` (load, build_model, parallelize) is the runtime's front door.
"""

from typing import Any

__version__ = "0.1.0"
GENERATOR_NAME = "hpcodegen"
__all__ = ["GENERATOR_NAME", "Artifact", "__version__"]


def __getattr__(name: str) -> Any:
    """``hpcodegen.Artifact`` without importing the runtime (or torch) up front."""
    if name == "Artifact":
        from hpcodegen.runtime.artifact import Artifact

        return Artifact
    raise AttributeError(f"module 'hpcodegen' has no attribute {name!r}")
