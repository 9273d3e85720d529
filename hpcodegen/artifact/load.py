"""Safe loading of an artifact's ``codegen_meta.json``: never a traceback, never code.

Every way the input can be unreadable becomes an :class:`~hpcodegen.errors.InputError`
(exit 2) naming the file and what was expected: a path that is neither an artifact dir nor a
meta file, a missing meta, a meta that links outside its directory, a file over the size
limit (refused before it is read), bytes that are not UTF-8, JSON syntax errors (with
line:column), values Python's ``json`` reads but JSON does not have (``NaN``, an integer
over 4300 digits), a top level that is not an object.
Duplicate object keys are legal JSON but ambiguous: they are returned as JSON pointers so the
``schema`` check reports them as errors.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcodegen.errors import InputError, error, pointer
from hpcodegen.gc_pause import paused_gc

if TYPE_CHECKING:
    from hpcodegen.plan.types import Plan

META_NAME = "codegen_meta.json"
#: Metas above this size are refused before parsing (a 10,000-entry plan is ~5 MB).
MAX_META_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class LoadedMeta:
    """A parsed meta and where it came from.

    Attributes:
        data: the JSON object, as parsed (last value wins for duplicate keys).
        meta_path: the ``codegen_meta.json`` file.
        artifact_dir: its directory (the artifact).
        duplicate_keys: JSON pointers of keys that occur more than once in one object.
        plan: the typed plan, once the checks passed (:func:`hpcodegen.verify.check_meta`
            builds it); None for a meta that was only read.
        bare: a meta file given alone (:func:`is_bare_meta`): the checks read the meta only,
            never the directory around it, and the runtime refuses it (no code to run).
        memo: what the checks derived from ``data`` alone (schema findings, the decoded
            plan), kept by :func:`hpcodegen.verify.check_meta` so a second check run on
            these same bytes (the runtime's config check after its load checks) reuses it
            instead of recomputing it; never compared, never keyed by path.
    """

    data: dict[str, Any]
    meta_path: Path
    artifact_dir: Path
    duplicate_keys: tuple[str, ...] = ()
    plan: Plan | None = None
    bare: bool = False
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def is_bare_meta(path: str | os.PathLike[str]) -> bool:
    """A meta file given on its own, not as an artifact.

    Metas are shared as single files (``g2_qwen3_moe.json``), often in a folder of other
    things (a virtualenv, a download dir). A file path is a bare meta unless it is named
    ``codegen_meta.json`` and its directory holds a generated bundle's code (``__init__.py``
    or a ``modeling_*_gen_npu.py``): that is the artifact's own meta, and stands for its
    directory. A directory is always the artifact.
    """
    p = Path(path)
    try:
        if not p.is_file():
            return False
        if p.name != META_NAME:
            return True
        from hpcodegen.checks.files import INIT_NAME, modeling_files

        folder = p.parent
        return not ((folder / INIT_NAME).exists() or modeling_files(folder))
    except OSError:  # a name too long: loading it says why
        return False


def resolve_meta_path(path: str | os.PathLike[str]) -> Path:
    """An artifact dir or a meta file -> the meta file; InputError when neither exists."""
    if not isinstance(path, (str, os.PathLike)):  # Python callers: None, a dict, ...
        raise InputError([error("load.bad_path", "artifact_dir",
                                f"not a path: got {type(path).__name__}",
                                expected=f"a directory holding {META_NAME} (str or PathLike)")])
    p = Path(path)
    try:
        is_dir, is_file = p.is_dir(), p.is_file()
    except OSError as exc:  # a name too long, a loop of links
        raise InputError([error("load.bad_path", "", f"unusable path: {exc.strerror or exc}",
                                file=str(p)[:200])]) from None
    if is_dir:
        meta = p / META_NAME
        if not meta.is_file():
            raise InputError([error("load.no_meta", str(p),
                                    f"artifact directory has no {META_NAME}",
                                    hint="run `hpcodegen generate` to create the artifact",
                                    file=str(meta))])
        return meta
    if is_file:
        return p
    raise InputError([error("load.not_found", str(p),
                            "no such artifact directory or meta file",
                            expected=f"a directory holding {META_NAME}, or the file itself",
                            file=str(p))])


class _DuplicateTracker:
    """``object_pairs_hook`` that remembers which parsed objects had repeated keys."""

    def __init__(self) -> None:
        self.dups: dict[int, list[str]] = {}

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)  # in C: a 10,000-entry meta has over 100,000 objects
        if len(obj) != len(pairs):  # a key repeated: name each repetition (rare)
            seen: set[str] = set()
            for key, _value in pairs:
                if key in seen:
                    self.dups.setdefault(id(obj), []).append(key)
                seen.add(key)
        return obj

    def pointers(self, root: Any) -> tuple[str, ...]:
        if not self.dups:
            return ()
        found: list[str] = []
        stack: list[tuple[str, Any]] = [("", root)]
        while stack:
            ptr, node = stack.pop()
            if isinstance(node, dict):
                found.extend(ptr + pointer(k) for k in self.dups.get(id(node), ()))
                stack.extend((ptr + pointer(k), v) for k, v in node.items())
            elif isinstance(node, list):
                stack.extend((f"{ptr}/{i}", v) for i, v in enumerate(node))
        return tuple(sorted(set(found)))


def parse_json_text(
    raw: bytes, file: str, max_bytes: int = MAX_META_BYTES, *, python_constants: bool = False
) -> tuple[Any, tuple[str, ...]]:
    """Decode and parse JSON bytes; returns ``(value, duplicate key pointers)``.

    ``python_constants``: accept ``NaN``, ``Infinity`` and ``-Infinity`` as floats, which
    Python's ``json`` (so transformers' ``save_pretrained``) writes for non-finite floats;
    an HF ``config.json`` is read so, our own metas stay strict JSON.

    Raises InputError for size, encoding and syntax problems.
    """
    if len(raw) > max_bytes:
        raise InputError([error("load.too_large", "", f"file is {len(raw)} bytes",
                                expected=f"at most {max_bytes} bytes", file=file)])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError([error("load.not_utf8", "", f"not UTF-8 text (byte {exc.start})",
                                expected="a UTF-8 JSON file", file=file)]) from None
    tracker = _DuplicateTracker()
    try:
        with paused_gc():  # a JSON tree has no cycles to collect
            value = json.loads(text, object_pairs_hook=tracker,
                               parse_constant=float if python_constants else _not_json)
    except json.JSONDecodeError as exc:
        raise InputError([error("load.invalid_json", f"line {exc.lineno}:{exc.colno}",
                                f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                                file=file)]) from None
    except ValueError as exc:  # an integer over Python's digit limit, NaN, Infinity
        what = ("an integer too long to read (over 4300 digits)"
                if "integer string conversion" in str(exc) else str(exc))
        raise InputError([error("load.invalid_json", "", f"unusable JSON value: {what}",
                                expected="standard JSON", file=file)]) from None
    except RecursionError:
        raise InputError([error("load.invalid_json", "", "JSON nested too deeply",
                                file=file)]) from None
    return value, tracker.pointers(value)


def _escapes_dir(meta_path: Path) -> bool:
    """True when the meta, links followed (nested ones too), lies outside its directory."""
    try:
        meta_path.resolve().relative_to(meta_path.parent.resolve())
    except (ValueError, OSError, RuntimeError):
        return True
    return False


def _not_json(constant: str) -> Any:
    """``parse_constant``: Python's ``json`` accepts NaN and Infinity; JSON does not."""
    raise ValueError(f"{constant} is not a JSON value")


def load_meta(path: str | os.PathLike[str], max_bytes: int = MAX_META_BYTES) -> LoadedMeta:
    """Load a meta from an artifact dir or a meta file.

    Args:
        path: the artifact directory, or its ``codegen_meta.json``, or a meta file alone
            (:func:`is_bare_meta`; ``bare`` is then set).
        max_bytes: refuse larger files before reading them.

    Returns:
        The parsed meta. It is *not* schema-validated here: run the ``schema`` check.

    Raises:
        InputError: (exit 2) the meta cannot be read as one JSON object.

    Example::

        meta = load_meta("examples/llama_tp2")
        meta.data["param_plan"]
    """
    meta_path = resolve_meta_path(path)
    file = str(meta_path)
    if _escapes_dir(meta_path):
        raise InputError([error("load.escapes", "", f"{META_NAME} resolves outside its "
                                f"artifact directory ({meta_path.resolve()})",
                                expected="a plain file inside the artifact dir",
                                hint="copy the meta into the artifact instead of linking it",
                                file=file)])
    try:
        size = meta_path.stat().st_size
        if size > max_bytes:
            raise InputError([error("load.too_large", "", f"file is {size} bytes",
                                    expected=f"at most {max_bytes} bytes", file=file)])
        raw = meta_path.read_bytes()
    except OSError as exc:
        raise InputError([error("load.unreadable", "", f"cannot read: {exc.strerror}",
                                file=file)]) from None
    value, dups = parse_json_text(raw, file, max_bytes)
    if not isinstance(value, dict):
        raise InputError([error("load.not_object", "", f"top level is a JSON {_json_type(value)}",
                                expected="a JSON object", file=file)])
    return LoadedMeta(value, meta_path, meta_path.parent, dups,
                      bare=meta_path == Path(path) and is_bare_meta(meta_path))


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "number", float: "number"}.get(type(value), type(value).__name__)
