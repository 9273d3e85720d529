"""Where an artifact's files are, without trusting the names the meta records.

The generated modeling file is the one ``modeling_*_gen_npu.py`` in the artifact dir (the
reference loader's rule, kept so its loader reads our bundles); output keys are roles
(``modeling``, ``diff``, ``init``) or relative file names, which must stay inside the dir.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

MODELING_GLOB = "modeling_*_gen_npu.py"
ROLES: tuple[str, ...] = ("modeling", "diff", "init")
INIT_NAME = "__init__.py"


def modeling_files(artifact_dir: Path) -> list[Path]:
    """Every ``modeling_*_gen_npu.py`` directly in the dir (the loader wants exactly one)."""
    return sorted(p for p in artifact_dir.glob(MODELING_GLOB) if p.is_file() or p.is_symlink())


def role_file_name(role: str, modeling: Path | None) -> str | None:
    """The file a role key stands for; None for ``modeling``/``diff`` without a modeling file."""
    if role == "init":
        return INIT_NAME
    if role in ("modeling", "diff"):
        if modeling is None:
            return None
        return modeling.name if role == "modeling" else modeling.name + ".diff"
    return role


def unsafe_name_reason(name: str) -> str | None:
    """Why a recorded file name may not be used (absolute, ``..``, backslash), or None."""
    if not name or name in (".", ".."):
        return "is empty or a directory name"
    if "\\" in name or "\x00" in name:
        return "contains a backslash or NUL"
    posix = PurePosixPath(name)
    if posix.is_absolute() or Path(name).is_absolute():
        return "is an absolute path"
    if ".." in posix.parts:
        return "climbs out of the artifact dir with '..'"
    return None


def escapes(artifact_dir: Path, path: Path) -> bool:
    """True when ``path`` (after following links) lies outside ``artifact_dir``."""
    try:
        path.resolve().relative_to(artifact_dir.resolve())
    except (ValueError, OSError, RuntimeError):
        return True
    return False


def present_files(artifact_dir: Path) -> set[str]:
    """Relative POSIX names of every file under the dir, ``__pycache__`` excluded.

    Links to directories are listed, not followed (a link cycle cannot hang the check).
    """
    out: set[str] = set()
    for root, dirs, files in os.walk(artifact_dir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        base = Path(root).relative_to(artifact_dir)
        links = [d for d in dirs if (Path(root) / d).is_symlink()]
        out.update((base / name).as_posix() for name in (*files, *links))
    return out
