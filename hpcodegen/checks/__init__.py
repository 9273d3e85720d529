"""The checks of ``hpcodegen verify``: one module per check, each yielding findings.

``schema``, ``plan``, ``outputs``, ``source`` and ``signature`` are pure (no torch); ``model``
loads torch and transformers lazily. :mod:`hpcodegen.checks.registry` names them.
"""
