"""Where an artifact's files are, without trusting the names the meta records.

The generated modeling file is the one ``modeling_*_gen_npu.py`` in the artifact dir (the
reference loader's rule, kept so its loader reads our bundles); output keys are roles
(``modeling``, ``diff``, ``init``) or relative file names, which must stay inside the dir.
:func:`read_recorded` is the one way a recorded file is read, by the ``outputs`` check and
by the runtime's loader alike: a name that climbs out, a link that leaves the dir, anything
but a plain file is refused with the reason.
"""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path, PurePosixPath

MODELING_GLOB = "modeling_*_gen_npu.py"
ROLES: tuple[str, ...] = ("modeling", "diff", "init")
INIT_NAME = "__init__.py"
BYTECODE_DIR = "__pycache__"
#: Longest recorded file name accepted (the schema says the same).
MAX_NAME = 255
#: Suffixes Python imports code from (``.py``, ``.pyc``, extension modules).
CODE_SUFFIXES: tuple[str, ...] = tuple(importlib.machinery.all_suffixes())


class RecordedFileError(Exception):
    """A recorded output that cannot be read safely; ``rule`` is the finding's rule name."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


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
    if len(name) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
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


def read_recorded(artifact_dir: Path, name: str) -> bytes:
    """The bytes of recorded file ``name``, read once; RecordedFileError when unsafe.

    Refused: an unsafe name (:func:`unsafe_name_reason`), a path that resolves outside the
    dir (links followed, nested ones too), a missing file, anything but a plain file.
    """
    reason = unsafe_name_reason(name)
    if reason:
        raise RecordedFileError("unsafe_name", f"output file name {name!r} {reason}")
    path = artifact_dir / name
    if escapes(artifact_dir, path):
        raise RecordedFileError("escapes", f"{name} links outside the artifact dir")
    try:
        if not path.exists():
            raise RecordedFileError("missing_file", f"recorded file {name} does not exist")
        if not path.is_file():
            raise RecordedFileError("not_a_file", f"{name} is not a plain file")
        return path.read_bytes()
    except OSError as exc:
        raise RecordedFileError("unreadable", f"cannot read {name}: "
                                f"{exc.strerror or exc}") from None


def present_files(artifact_dir: Path) -> set[str]:
    """Relative POSIX names of every file under the dir; a ``__pycache__`` dir is listed as
    ``<dir>/__pycache__`` and not entered (bytecode is never checked, so it is a finding).

    Links to directories are listed, not followed (a link cycle cannot hang the check).
    """
    out: set[str] = set()
    for root, dirs, files in os.walk(artifact_dir, followlinks=False):
        base = Path(root).relative_to(artifact_dir)
        out.update((base / d).as_posix() for d in dirs if d == BYTECODE_DIR)
        dirs[:] = sorted(d for d in dirs if d != BYTECODE_DIR)
        links = [d for d in dirs if (Path(root) / d).is_symlink()]
        out.update((base / name).as_posix() for name in (*files, *links))
    return out


def is_code(name: str) -> bool:
    """A file Python could import or execute: ``__pycache__``, ``.py``, ``.pyc``, ``.so``."""
    return BYTECODE_DIR in PurePosixPath(name).parts or name.endswith(CODE_SUFFIXES)
