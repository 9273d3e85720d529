"""A rank's one :class:`hpcodegen.Artifact`: read and checked once, then reused.

The mesh a rank builds, the model class it constructs and the plan it installs all come
from this one checked artifact (``Artifact.load``: schema, plan, injection targets, output
hashes), never from a meta read on the side: the layout is resolved from a plan that passed
the checks. Comparing it with a model directory's config (architecture and signature)
reuses the bytes already read (:meth:`hpcodegen.Artifact.with_config`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcodegen.launch import env

_LOADED: dict[str, Any] = {}
_CHECKED: dict[tuple[str, str], Any] = {}


def rank_artifact(artifact: str | Path) -> Any:
    """The rank's checked :class:`hpcodegen.Artifact` of ``artifact``, loaded once."""
    from hpcodegen.runtime.artifact import Artifact

    key = str(Path(artifact).resolve())
    if key not in _LOADED:
        _LOADED[key] = Artifact.load(artifact, allowed_target_prefixes=env.allowed_targets())
    return _LOADED[key]


def checked_artifact(artifact: str | Path, config: dict[str, Any]) -> Any:
    """:func:`rank_artifact` checked against ``config`` (architecture and signature), once
    per config; building and parallelizing reuse it."""
    key = (str(Path(artifact).resolve()), json.dumps(config, sort_keys=True, default=str))
    if key not in _CHECKED:
        _CHECKED[key] = rank_artifact(artifact).with_config(config)
    return _CHECKED[key]
