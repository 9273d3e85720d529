"""``hpcodegen generate``: HF TP plan (+ recipe) -> frozen meta + generated modeling module.

Entry points: :func:`hpcodegen.generate.api.run_generate` (the CLI verb) and
``python -m hpcodegen.generate.examples [--check]``. torch and transformers load lazily.
"""
