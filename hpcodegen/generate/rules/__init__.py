"""Tensor-parallel rules shipped with hpcodegen, one ``<model_type>.yaml`` per model family.

They are read by :mod:`hpcodegen.generate.sources.package_rules` (the format is described there and
in docs/generate.md) where transformers ships no ``base_model_tp_plan`` or its plan is wrong.
"""
