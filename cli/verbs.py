"""Registers every verb on the app: importing a verb module adds its command."""

from __future__ import annotations

from . import (  # noqa: F401  (imported for their @app.command registrations)
    export_cmd,
    generate_cmd,
    inspect_cmd,
    launch_cmd,
    schema_cmd,
    verify_cmd,
)
