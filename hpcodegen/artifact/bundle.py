"""Atomic, reproducible writing of an artifact bundle (pure: stdlib only).

A bundle is published all at once or not at all: every file is staged in a sibling temp dir
(``.hpcodegen_tmp_*`` next to the target), the meta is written last with the ``outputs``
hashes of the staged files, then the old bundle is moved aside (``.hpcodegen_old_*``), the
staged one renamed into place and the old one deleted. The swap is one atomic
``renameat2(RENAME_EXCHANGE)`` on Linux, so a failure or a kill at any moment leaves either
the previous bundle or the new one in place, never a mix (elsewhere a failed swap moves the
old bundle back). Rendering is separate from writing, so ``--check`` compares the exact bytes
that would be written with what is on disk.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcodegen.artifact.digest import bytes_digest
from hpcodegen.artifact.load import META_NAME

TMP_PREFIX = ".hpcodegen_tmp_"
OLD_PREFIX = ".hpcodegen_old_"


def dump_meta(meta: Mapping[str, Any]) -> bytes:
    """The meta's file bytes: indent 2, sorted keys, ASCII, one trailing newline."""
    return (json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or name == META_NAME:
        raise ValueError(f"bundle file keys must be plain names other than {META_NAME}, "
                         f"got {name!r}")


def render_bundle(files: Mapping[str, bytes], roles: Mapping[str, str],
                  meta: Mapping[str, Any]) -> dict[str, bytes]:
    """Every file of the bundle, meta included, as bytes.

    Args:
        files: file name -> bytes (plain names, the meta excluded).
        roles: file name -> its key in ``meta.outputs`` (``modeling``, ``diff``, ``init``);
            other files are keyed by their name.
        meta: the meta without ``outputs``; a copy gets them.

    Returns:
        ``{name: bytes}`` in sorted name order, ``codegen_meta.json`` included.
    """
    for name in files:
        _check_name(name)
    outputs = {roles.get(name, name): bytes_digest(data) for name, data in files.items()}
    full = dict(meta, outputs=dict(sorted(outputs.items())))
    rendered = {name: files[name] for name in sorted(files)}
    rendered[META_NAME] = dump_meta(full)
    return rendered


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_bundle(target: Path, rendered: Mapping[str, bytes],
                 _after_stage: Callable[[Path], None] | None = None) -> None:
    """Publish ``rendered`` (from :func:`render_bundle`) as the directory ``target``.

    The meta is written last into the staging dir. ``_after_stage`` is a test hook called
    with the staging dir just before the swap (to simulate a failure there).
    """
    target = Path(target)
    check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover_bundle(target)
    stage = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}_", dir=target.parent))
    try:
        os.chmod(stage, 0o777 & ~current_umask())
        for name in sorted(n for n in rendered if n != META_NAME):
            _write(stage / name, rendered[name])
        _write(stage / META_NAME, rendered[META_NAME])
        if _after_stage is not None:
            _after_stage(stage)
        _swap(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


class BundleTargetError(ValueError):
    """The target exists and is not a bundle: replacing it would destroy the user's files."""


def check_target(target: Path) -> None:
    """Refuse a target that is a file, or a non-empty directory without a meta."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise BundleTargetError(f"{target} exists and is not a directory")
    existing = next((p for p in target.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise BundleTargetError(f"{existing} is a file: it cannot hold {target.name}")
    if target.is_dir() and any(target.iterdir()) and not (target / META_NAME).is_file():
        raise BundleTargetError(f"{target} is a non-empty directory without {META_NAME}; "
                                "refusing to replace it (choose an empty or new directory)")


def recover_bundle(target: Path) -> None:
    """Undo what a killed writer left next to ``target``.

    Staging dirs of ``target`` are deleted (the meta in them may be unwritten). A bundle
    moved aside by the non-atomic fallback swap is moved back when ``target`` is missing.
    """
    target = Path(target)
    if not target.parent.is_dir():
        return
    olds = sorted(target.parent.glob(f"{OLD_PREFIX}{target.name}_*"))
    if olds and not target.exists():
        os.rename(olds.pop(), target)
    for stale in [*olds, *target.parent.glob(f"{TMP_PREFIX}{target.name}_*")]:
        shutil.rmtree(stale, ignore_errors=True)


def current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux ``renameat2``); False when unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return rc == 0


def _swap(stage: Path, target: Path) -> None:
    """Publish ``stage`` as ``target``; the old bundle is never lost.

    A new target is one rename. An existing one is exchanged with the staged dir in one
    atomic step where the kernel allows it (then the old bundle, now in the staging dir, is
    deleted); otherwise it is moved aside to ``.hpcodegen_old_<name>_*``, the staged dir
    renamed in, and on failure moved back.
    """
    if not target.exists():
        os.rename(stage, target)
        return
    if _exchange(stage, target):
        shutil.rmtree(stage, ignore_errors=True)
        return
    old = Path(tempfile.mkdtemp(prefix=f"{OLD_PREFIX}{target.name}_", dir=target.parent))
    os.rmdir(old)
    os.rename(target, old)
    try:
        os.rename(stage, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def diff_bundle(target: Path, rendered: Mapping[str, bytes]) -> list[str]:
    """Names of files whose bytes on disk differ from ``rendered`` (missing, extra, drifted)."""
    target = Path(target)
    drifted = []
    for name, data in rendered.items():
        path = target / name
        if not path.is_file():
            drifted.append(f"{name}: missing on disk")
        elif path.read_bytes() != data:
            drifted.append(f"{name}: bytes differ from the regenerated bundle")
    if target.is_dir():
        for path in sorted(target.iterdir()):
            if path.name not in rendered and path.name != "__pycache__":
                drifted.append(f"{path.name}: not part of the regenerated bundle")
    return drifted
