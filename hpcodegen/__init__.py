"""hpcodegen: frozen tensor-parallel plans for HF transformers models.

The pure core (``errors``, ``placement``, ``artifact``, ``plan``, ``checks``) imports neither
torch nor transformers; ``runtime``, ``generate`` and ``launch`` load them lazily.
"""

__version__ = "0.1.0"
GENERATOR_NAME = "hpcodegen"
