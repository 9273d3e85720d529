"""Edited copies of the example artifacts for refusal tests (signature and hashes kept
consistent unless a test wants them stale)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcodegen.artifact.digest import bytes_digest, meta_signature

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def copy_artifact(src: str, dest: Path, edit: Callable[[dict[str, Any]], None] | None = None
                  ) -> Path:
    """Copy ``examples/<src>`` to ``dest``; apply ``edit`` to its meta and re-sign it."""
    shutil.copytree(EXAMPLES / src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if edit is not None:
        path = dest / "codegen_meta.json"
        meta = json.loads(path.read_text())
        edit(meta)
        meta["signature"] = meta_signature(meta)
        path.write_text(json.dumps(meta, indent=2, sort_keys=True))
    return dest


def record_file(art: Path, key: str, name: str, text: str) -> Path:
    """Write ``art/name`` and record its digest under ``outputs[key]`` (hashes consistent)."""
    path = art / name
    path.write_text(text)
    meta_path = art / "codegen_meta.json"
    meta = json.loads(meta_path.read_text())
    meta["outputs"][key] = bytes_digest(path.read_bytes())
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True))
    return path
