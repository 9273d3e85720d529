"""Registers every verb on the app. Each verb lives in its own module."""

from __future__ import annotations

import importlib

for _name in ("schema_cmd", "verify_cmd", "inspect_cmd", "generate_cmd", "launch_cmd"):
    try:
        importlib.import_module(f"{__package__}.{_name}")
    except ModuleNotFoundError as exc:  # a verb not written yet
        if exc.name != f"{__package__}.{_name}":
            raise
