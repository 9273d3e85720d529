"""Passing verdicts of launch's pre-start model check, kept by the bytes they judged.

Why: the model check (:mod:`hpcodegen.launch.launcher.model_check`) starts a child that
imports torch and transformers and derives the plan: seconds of CPU before every launch,
though a launch of an artifact already checked against the same config can only get the
same answer. So a pass is recorded under the sha256 of everything the answer depends on,
and a later launch whose inputs hash the same reuses it instead of starting the child.

What the key covers (:func:`verdict_inputs`): the meta's bytes, every ``*.py`` file of the
artifact directory (the generated modeling module, ``__init__.py``), the config file's
bytes, the ``--allow-target`` prefixes, hpcodegen's version and the digest of every file of
the installed package (an edited checkout is another checker), and the versions of Python,
torch and transformers (read from their installed metadata: no import). A verdict is
trusted only when every one of these matches the record (the file name is the digest of
all of them, and the record repeats them, so a truncated or foreign file is a miss). Only
passes are kept: a refusal is re-checked every time, so its findings are always fresh.

Where: ``$HPCODEGEN_CHECK_CACHE`` when set (``off`` or ``0``: no cache), else
``$XDG_CACHE_HOME/hpcodegen/model-check``, else ``~/.cache/hpcodegen/model-check``; one
JSON file per verdict, written atomically. An unusable cache directory only costs the
check: the launch never fails because of it. Pure: imports neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import hpcodegen
from hpcodegen.atomic import write_atomic

#: the environment variable naming the cache directory (``off`` or ``0``: no cache)
CACHE_ENV = "HPCODEGEN_CHECK_CACHE"
#: the record's format; another format is a miss
FORMAT = 1
_OFF = ("0", "off", "no", "false")


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where verdicts live, or None when the cache is switched off."""
    named = environ.get(CACHE_ENV)
    if named is not None:
        return None if named.strip().lower() in _OFF or not named.strip() else Path(named)
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpcodegen" / "model-check"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@cache
def package_digest() -> str:
    """sha256 over every file of the installed hpcodegen package (path and bytes), bytecode
    caches left out: a checkout edited since a verdict was recorded is another checker."""
    root = Path(hpcodegen.__file__).resolve().parent
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def verdict_inputs(meta_path: Path, config_path: Path,
                   allow_target: Sequence[str] = ()) -> dict[str, Any]:
    """Everything the model check's answer depends on, as digests and versions.

    Raises OSError when a file cannot be read (the caller then runs the check)."""
    artifact = meta_path.parent
    modules = {p.name: _sha256(p) for p in sorted(artifact.glob("*.py")) if p.is_file()}
    return {
        "format": FORMAT,
        "meta": _sha256(meta_path),
        "artifact_modules": modules,
        "config": _sha256(config_path),
        "allow_target": list(allow_target),
        "hpcodegen": hpcodegen.__version__,
        "hpcodegen_files": package_digest(),
        "python": sys.version,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
    }


def _key(inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def load_verdict(directory: Path, inputs: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The recorded warnings of a pass for exactly these inputs; None on any miss."""
    try:
        record = json.loads((directory / f"{_key(inputs)}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("inputs") != inputs \
            or record.get("verdict") != "pass" or not isinstance(record.get("warnings"), list):
        return None
    return record["warnings"]


def store_verdict(directory: Path, inputs: Mapping[str, Any],
                  warnings: Sequence[Mapping[str, Any]]) -> Path | None:
    """Record a pass (atomically); the record's path, or None when it cannot be written."""
    record = {"verdict": "pass", "inputs": dict(inputs), "warnings": list(warnings)}
    path = directory / f"{_key(inputs)}.json"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    except OSError:
        return None
    return path
