"""Atomic, reproducible writing of an artifact bundle (pure: stdlib only).

A bundle is published all at once or not at all: every file is staged in a sibling temp dir
(``.hpcodegen_tmp_*`` next to the target), the meta is written last with the ``outputs``
hashes of the staged files, then the old bundle is moved aside (``.hpcodegen_old_*``), the
staged one renamed into place and the old one deleted. The swap is one atomic
``renameat2(RENAME_EXCHANGE)`` on Linux, so a failure or a kill at any moment leaves either
the previous bundle or the new one in place, never a mix (elsewhere a failed swap moves the
old bundle back). Rendering is separate from writing, so ``--check`` compares the exact bytes
that would be written with what is on disk.

Nothing of the user's is lost (:func:`check_target`): an existing target may hold only a
previous bundle's own files (its meta, the files its ``outputs`` record, the generated
modeling file, its diff, ``__init__.py`` and a ``__pycache__`` of their bytecode); a model's config,
weights or notes beside them make the write refuse, naming them. A target that is a
symbolic link is followed: the bundle is written where the link points and the link keeps
pointing to it. Cleanup removes only what a writer made: its own staging dir, and a killed
writer's staging dir only when its name says it was made by a process of this host that is
gone.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcodegen.artifact.digest import bytes_digest
from hpcodegen.artifact.load import META_NAME

TMP_PREFIX = ".hpcodegen_tmp_"
OLD_PREFIX = ".hpcodegen_old_"
#: Names of the files a bundle is made of, besides the meta and what ``outputs`` records.
OWN_NAMES = ("__init__.py", "__pycache__")
OWN_SUFFIXES = ("_gen_npu.py", "_gen_npu.py.diff")


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
    target = resolve_target(target)
    check_target(target, rendered)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover_bundle(target)
    stage = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}_",
                                  suffix=f".{_writer()}", dir=target.parent))
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


def resolve_target(target: Path) -> Path:
    """``target`` as an absolute path (``-o .`` has a parent to stage in), or the directory
    it links to (followed deliberately: the link stays)."""
    target = Path(target)
    return Path(os.path.realpath(target) if target.is_symlink() else os.path.abspath(target))


def check_target(target: Path, rendered: Mapping[str, bytes] | None = None) -> None:
    """Refuse a target that is a file, or a directory holding anything but a previous
    bundle's own files (:func:`foreign_entries`); ``rendered``'s names count as its own."""
    target = resolve_target(target)
    if target.exists() and not target.is_dir():
        raise BundleTargetError(f"{target} exists and is not a directory")
    existing = next((p for p in target.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise BundleTargetError(f"{existing} is a file: it cannot hold {target.name}")
    if not target.is_dir() or not any(target.iterdir()):
        return
    if not (target / META_NAME).is_file():
        raise BundleTargetError(f"{target} is a non-empty directory without {META_NAME}; "
                                "refusing to replace it (choose an empty or new directory)")
    foreign = foreign_entries(target, rendered or {})
    if foreign:
        more = f" (+{len(foreign) - 3} more)" if len(foreign) > 3 else ""
        raise BundleTargetError(
            f"{target} holds files that are not part of its artifact: "
            f"{', '.join(foreign[:3])}{more}; refusing to replace it, which would delete "
            "them (generate into a directory of its own and pass --model-dir for the model)")


def foreign_entries(target: Path, rendered: Mapping[str, bytes]) -> list[str]:
    """Entries of bundle dir ``target`` that are not the bundle's own (sorted).

    Its own: the meta, the names ``rendered`` writes, the plain names its current meta's
    ``outputs`` record, the generated modeling file and its diff, ``__init__.py`` (each a
    regular file, not a link) and a ``__pycache__`` directory holding only the bytecode
    Python writes for those modules (``<module>.<tag>.pyc``): a file of any other name
    there is the user's, named as ``__pycache__/<name>``, and the write is refused.
    """
    own = {META_NAME, *rendered, *_recorded_names(target / META_NAME)}
    out = []
    modules: set[str] = set()
    entries = sorted(target.iterdir(), key=lambda p: p.name)
    for entry in entries:
        name = entry.name
        if name == "__pycache__":
            continue
        known = name in own or name in OWN_NAMES or _generated_name(name)
        if known and entry.is_file() and not entry.is_symlink():
            if name.endswith(".py"):
                modules.add(name[:-3])
        else:
            out.append(name)
    modules |= {n[:-3] for n in rendered if n.endswith(".py")}
    cache = target / "__pycache__"
    if cache.is_symlink() or (cache.exists() and not cache.is_dir()):
        out.append("__pycache__")
    elif cache.is_dir():
        out += [f"__pycache__/{p.name}" for p in sorted(cache.iterdir(), key=lambda p: p.name)
                if p.is_symlink() or not p.is_file() or not _bytecode_of(p.name, modules)]
    return sorted(out)


def _generated_name(name: str) -> bool:
    """The generated modeling file's name (``modeling_*_gen_npu.py``) or its diff's."""
    from fnmatch import fnmatchcase

    return any(fnmatchcase(name, f"modeling_*{suffix}") for suffix in OWN_SUFFIXES)


def _bytecode_of(name: str, modules: set[str]) -> bool:
    """``name`` is what Python writes in ``__pycache__`` for one of ``modules``
    (``<module>.<implementation tag>.pyc``, optionally ``.opt-N``)."""
    stem, dot, rest = name.partition(".")
    return bool(dot) and stem in modules and rest.endswith(".pyc") and "/" not in rest


def _recorded_names(meta_path: Path) -> list[str]:
    """Plain file names the meta's ``outputs`` records whose bytes are still the recorded
    ones (role keys stand for files above): a file generate wrote. A name the meta records
    but whose bytes differ (a hand-edited meta claiming a user's file) is not ours."""
    try:
        if meta_path.stat().st_size > 64 * 2**20:
            return []
        outputs = json.loads(meta_path.read_text("utf-8")).get("outputs")
    except (OSError, ValueError, AttributeError, RecursionError):
        return []
    if not isinstance(outputs, dict):
        return []
    names = [k for k, v in outputs.items() if isinstance(k, str) and k and "/" not in k
             and "\\" not in k and k not in (".", "..") and isinstance(v, dict)]
    return [k for k in names if _holds(meta_path.parent / k, outputs[k].get("sha256"))]


def _holds(path: Path, sha256: Any) -> bool:
    """``path`` is a regular file (not a link) of at most 64 MiB with that sha256."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 64 * 2**20:
            return False
        return bytes_digest(path.read_bytes())["sha256"] == sha256
    except OSError:
        return False


def _writer() -> str:
    """``<host>-<pid>``: who made a staging dir (its name carries it)."""
    import socket

    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:64]
    return f"{host}-{os.getpid()}"


def _abandoned(stage: Path, target: Path) -> bool:
    """A staging dir made by a writer of this host that no longer runs (its name says
    which: ``<prefix><target>_<random>.<host>-<pid>``; the random part has no dot)."""
    rest = stage.name[len(f"{TMP_PREFIX}{target.name}_"):]
    host, _, pid = rest.partition(".")[2].rpartition("-")
    me, _, _ = _writer().rpartition("-")
    if host != me or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def recover_bundle(target: Path) -> None:
    """Undo what a killed writer left next to ``target``.

    A staging dir of ``target`` is deleted only when its name says a writer of this host
    that is gone made it (a live writer's, or a foreign dir, is left alone). A bundle moved aside by
    the non-atomic fallback swap is moved back when ``target`` is missing.
    """
    target = Path(target)
    if not target.parent.is_dir():
        return
    olds = sorted(target.parent.glob(f"{OLD_PREFIX}{target.name}_*"))
    if olds and not target.exists():
        os.rename(olds.pop(), target)
    for stale in olds:
        shutil.rmtree(stale, ignore_errors=True)
    for stale in target.parent.glob(f"{TMP_PREFIX}{target.name}_*"):
        if _abandoned(stale, target):
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
