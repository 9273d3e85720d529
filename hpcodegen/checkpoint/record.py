"""``hpcodegen_checkpoint.json``: what a saved checkpoint is, readable without torch.

Written next to the ``torch.distributed.checkpoint`` files of every checkpoint
:func:`hpcodegen.checkpoint.save` writes. It records what DCP does not: the HF config
(``export`` writes it back as ``config.json``), the artifact and its signature, the step,
the dtype, the mesh it was saved on and each parameter's global shape and placements, plus
tied aliases, and the sha256 of every file of the checkpoint (``files``). The launcher
reads it before starting anything, so a resume of another model is refused as a usage
error (exit 2), naming the config fields that differ.

A record is untrusted input like the rest of the directory: :func:`read_record` checks
every field's type and bounds before anything uses it, and :func:`check_digests` finds a
changed or truncated data file before its bytes are loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpcodegen.atomic import write_atomic
from hpcodegen.errors import InputError, UsageError, error
from hpcodegen.hf import architecture_of, structure_of

RECORD_NAME = "hpcodegen_checkpoint.json"
FORMAT = "hpcodegen-checkpoint/1"
#: Largest record read (a record lists every parameter: a few MiB for the largest models).
MAX_RECORD_BYTES = 64 * 2**20
#: The dtypes a checkpoint's parameters may be saved in (``launch --dtype``).
DTYPES = ("float32", "bfloat16", "float16", "float64")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FILE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,254}$")


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_files(directory: Path) -> list[str]:
    """Names of the checkpoint's files: every regular file but the record and temp files."""
    return sorted(p.name for p in Path(directory).iterdir()
                  if p.name != RECORD_NAME and not p.name.startswith(".record.")
                  and stat.S_ISREG(p.lstat().st_mode))


def write_record(directory: Path, record: Mapping[str, Any],
                 digests: Mapping[str, str] | None = None) -> None:
    """Atomically write ``directory/hpcodegen_checkpoint.json``.

    ``files`` records the sha256 of every other file of the directory; ``digests`` gives
    those already computed (by the ranks that wrote them), the rest are hashed here.
    """
    target = Path(directory) / RECORD_NAME
    known = dict(digests or {})
    files = {name: known.get(name) or file_sha256(Path(directory) / name)
             for name in data_files(Path(directory))}
    write_atomic(target, lambda fh: json.dump({"format": FORMAT, **record, "files": files}, fh,
                                              indent=1, sort_keys=True))


def read_record(directory: str | os.PathLike[str], *, checked: bool = True) -> dict[str, Any]:
    """The record of a checkpoint directory, every field checked (:func:`record_problems`;
    ``checked=False``: only its format and config, to name another model's checkpoint).

    Raises:
        InputError: (exit 2) not a checkpoint, unreadable, or a field of the wrong type.
    """
    from hpcodegen.artifact.load import parse_json_text

    path = Path(directory) / RECORD_NAME
    try:
        found = Path(directory).is_dir() and path.exists()
    except OSError:  # a name too long, a loop of links
        found = False
    if not found:
        raise InputError([error("checkpoint.not_found", str(directory)[:200],
                                f"not an hpcodegen checkpoint (no {RECORD_NAME})",
                                hint="save one with `hpcodegen launch ... --save DIR`")])
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            raise OSError(f"{RECORD_NAME} is not a regular file")
        raw = path.read_bytes() if path.stat().st_size <= MAX_RECORD_BYTES else None
    except OSError as exc:
        raise InputError([error("checkpoint.unreadable", "", f"unreadable: {exc}",
                                file=str(path))]) from None
    if raw is None:
        raise InputError([error("checkpoint.unreadable", "", "larger than "
                                f"{MAX_RECORD_BYTES // 2**20} MiB", file=str(path))])
    data, _ = parse_json_text(raw, str(path), MAX_RECORD_BYTES, python_constants=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT \
            or not isinstance(data.get("config"), dict):
        raise InputError([error("checkpoint.format", "/format",
                                f"not a {FORMAT} record", file=str(path))])
    problems = record_problems(data) if checked else []
    if problems:
        raise InputError([error("checkpoint.record", where, message, file=str(path),
                                hint="the record was edited or damaged; save the "
                                     "checkpoint again") for where, message in problems[:5]])
    return data


def _shape(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= 64 and all(
        type(n) is int and 0 <= n < 2**48 for n in value)


def record_problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(JSON pointer, what is wrong)`` for every field of a record that is not what
    :func:`hpcodegen.checkpoint.save` writes; empty when the record is well-formed."""
    from hpcodegen.errors import pointer

    out: list[tuple[str, str]] = []
    params = data.get("params")
    if not isinstance(params, dict) or not params:
        out.append(("/params", "expected an object of parameter name -> shape and placements"))
        params = {}
    for name, spec in params.items():
        if not isinstance(spec, dict) or not _shape(spec.get("shape")) \
                or not isinstance(spec.get("placements", {}), dict):
            out.append((pointer("params", name), 'expected {"shape": [non-negative '
                                                 'integers], "placements": {axis: placement}}'))
    aliases = data.get("aliases", {})
    if not isinstance(aliases, dict) or not all(
            isinstance(v, str) and v in params and k not in params for k, v in aliases.items()):
        out.append(("/aliases", "expected an object of tied name -> a saved parameter"))
    if data.get("dtype", "float32") not in DTYPES:
        out.append(("/dtype", f"expected one of {', '.join(DTYPES)}"))
    step = data.get("step", 0)
    if type(step) is not int or not 0 <= step < 2**63:
        out.append(("/step", "expected an integer in 0 .. 2^63-1"))
    files = data.get("files")
    if not isinstance(files, dict) or not files or not all(
            isinstance(k, str) and _FILE.match(k) and isinstance(v, str) and _SHA256.match(v)
            for k, v in files.items()):
        out.append(("/files", "expected an object of file name -> sha256 (written by "
                              "hpcodegen's save)"))
    return out


def check_digests(directory: str | os.PathLike[str], record: Mapping[str, Any],
                  names: Iterable[str] | None = None) -> list[str]:
    """The files (of ``names``, default all recorded) whose bytes are not the recorded
    ones: missing, not regular files, or another sha256. Empty when all match."""
    directory = Path(directory)
    files = record["files"]
    bad = []
    for name in sorted(files) if names is None else names:
        path = directory / name
        try:
            ok = stat.S_ISREG(path.lstat().st_mode) and file_sha256(path) == files[name]
        except OSError:
            ok = False
        if not ok:
            bad.append(name)
    return bad


def check_same_model(record: Mapping[str, Any], config: Mapping[str, Any],
                     directory: str | os.PathLike[str]) -> None:
    """Refuse to resume a checkpoint of another model (architecture or shape fields).

    The tp and dp sizes may differ (DCP reshards); the model may not.
    """
    saved = record["config"]
    problems = []
    if architecture_of(saved) != architecture_of(config):
        problems.append(f"architecture {architecture_of(saved)!r} vs {architecture_of(config)!r}")
    a, b = structure_of(saved), structure_of(config)
    problems += [f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b))
                 if a.get(k) != b.get(k)]
    if problems:
        raise UsageError([error("checkpoint.other_model", str(directory),
                                "the checkpoint is of another model (checkpoint vs config): "
                                + "; ".join(problems),
                                hint="resume with the config the checkpoint was saved with")])


def creation_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the directory ``path`` (new or existing) could not be created or written into,
    or None: its nearest existing ancestor must be a directory in which this user can
    create an entry. Probed by creating one (an empty temporary directory, removed), not
    by ``os.access``: root passes ``access()`` on a read-only mount or ``/proc``. One rule
    for every output directory a command is refused on before it starts (``launch --save``
    and ``--log-dir``, ``export -o``)."""
    path = Path(os.path.abspath(path))
    try:
        ancestor = path.parent  # staged in a sibling and renamed: the parent must be writable
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"{ancestor} is not a directory"
        if any(len(os.fsencode(part)) > 255 for part in path.parts):
            return "a name is longer than 255 bytes"
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".hpcodegen-probe-", dir=ancestor))
        except OSError as exc:
            return f"nothing can be created in {ancestor} ({exc.strerror or exc})"
    except OSError as exc:
        return f"unusable path: {exc.strerror or exc}"
    return None


def check_target(directory: str | os.PathLike[str]) -> None:
    """Refuse to write to ``directory`` (UsageError, exit 2) unless it is new or an empty
    directory and can be created (:func:`creation_problem`): ``launch --save`` is refused
    before training, ``export -o`` before the checkpoint is read."""
    path = Path(os.path.abspath(directory))
    try:
        exists = path.exists()
        if exists and (not path.is_dir() or any(path.iterdir())):
            raise UsageError([error("checkpoint.target_exists", str(path),
                                    "exists and is not an empty directory",
                                    hint="write to a new or empty directory (nothing is "
                                         "overwritten)")])
        problem = creation_problem(path)
    except OSError as exc:
        problem = f"unusable path: {exc.strerror or exc}"
    if problem is not None:
        raise UsageError([error("checkpoint.target_unwritable", str(path)[:300],
                                f"cannot be created: {problem}",
                                hint="choose a directory under one you can write to")])
