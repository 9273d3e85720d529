"""Which transformers families hpcodegen supports, measured (``bench/coverage.py``).

:mod:`~hpcodegen.families.catalog` (the families and their kinds),
:mod:`~hpcodegen.families.tiny` (a tiny config of any family),
:mod:`~hpcodegen.families.probe` (phase 1: generate, verify, inspect-plan per family),
:mod:`~hpcodegen.families.parity` (phase 2: the parity harness on gloo ranks),
:mod:`~hpcodegen.families.report` (docs/models.md and its counting rule).
"""
