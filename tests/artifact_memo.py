"""The suite's one memo of generated artifacts: each distinct build is paid once per run.

Many tests in several directories generate the same tiny artifacts (tests/generate reads a
family's plan, tests/runtime runs the same family's parity on gloo ranks, tests/cp, tests/moe
and the CLI gate tests read or edit the artifact of one config at one set of flags). The
build is the real one (:func:`hpcodegen.generate.api.build_bundle`), keyed by every argument
that changes its bytes: the config (its key order included, as the meta keeps it), tp, sp,
the recipe, the label, every option (ep, cp, layout, method, loss parallel, the generation
record ``inputs``...). So a test sees the bytes its own call would have produced.

Where a build is kept: in this process, and in the run's directory named by
``HPCODEGEN_TEST_ARTIFACTS`` (``tests/conftest.py`` makes one fresh directory per run,
shared by the xdist workers as the model check's verdict cache is; a process without it
keeps builds in memory only). A kept build is pickled ``(files, notes, warnings)``, written
whole under a temporary name then renamed, so a worker reads a complete entry or none; two
workers building the same key at once both build and write equal bytes.

No test can alter another's result: the files come back in a fresh dict of ``bytes`` (and
:func:`write_artifact` / :func:`generate` write a fresh directory each call, for tests that
edit their artifact), the notes and warnings are replayed into the caller's lists
(findings are frozen dataclasses). A build that raises is never kept: each such call runs
again, so every refusal a test asserts is its own. Arguments that are not JSON (a test
passing an object) bypass the memo. A test that patches what the build reads
(``monkeypatch``) calls :func:`hpcodegen.generate.api.build_bundle` itself: the key does not
see the patch.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import pickle
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcodegen.errors import Finding

#: the run-wide directory of kept builds (set by tests/conftest.py for the whole run)
DIR_ENV = "HPCODEGEN_TEST_ARTIFACTS"

Kept = tuple[dict[str, bytes], tuple[str, ...], tuple[Finding, ...]]

#: build_bundle's parameters that do not change the bytes (the memo replays notes/warnings)
_NOT_KEYED = frozenset({"advance", "notes", "warnings"})
#: key -> (files, notes, warnings) of the first build with those arguments, in this process
_BUILT: dict[str, Kept] = {}
#: how each call was answered, in order: "process" / "run" (the memo's hits), "built"
answers: list[str] = []


def _key(config: Mapping[str, Any], tp: int, sp: bool,
         recipe: Sequence[Mapping[str, Any]] | None, label: str,
         options: Mapping[str, Any]) -> str | None:
    """Every argument of the build as JSON, the omitted ones at their defaults (a call
    naming ``ep=1`` and one leaving it out share a build); None: no exact key (arguments
    that are not JSON, a progress callback, an unknown option), so no sharing."""
    from hpcodegen.generate import api

    try:
        bound = inspect.signature(api.build_bundle).bind(config, tp, sp, recipe, label,
                                                         **options)
    except TypeError:  # the build itself says what is wrong
        return None
    if "advance" in bound.arguments:
        return None
    bound.apply_defaults()
    try:
        return json.dumps([[name, value] for name, value in bound.arguments.items()
                           if name not in _NOT_KEYED])
    except TypeError:
        return None


def _run_file(key: str) -> Path | None:
    where = os.environ.get(DIR_ENV)
    if not where:
        return None
    return Path(where) / f"{hashlib.sha256(key.encode()).hexdigest()}.pickle"


def _read_run(key: str) -> Kept | None:
    path = _run_file(key)
    if path is None or not path.is_file():
        return None
    with path.open("rb") as f:
        stored_key, kept = pickle.load(f)
    return kept if stored_key == key else None  # a digest collision is a miss


def _keep_run(key: str, kept: Kept) -> None:
    path = _run_file(key)
    if path is None:
        return
    fd, tmp = tempfile.mkstemp(prefix=".writing-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump((key, kept), f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_bundle(config: Mapping[str, Any], tp: int, sp: bool,
                 recipe: Sequence[Mapping[str, Any]] | None, label: str, *,
                 notes: list[str] | None = None, warnings: list[Finding] | None = None,
                 **options: Any) -> dict[str, bytes]:
    """:func:`hpcodegen.generate.api.build_bundle` (same arguments, keyword options), built
    once per distinct arguments and run; a fresh dict of the files each call."""
    from hpcodegen.generate import api

    key = _key(config, tp, sp, recipe, label, options)
    if key is None:
        answers.append("built")
        return api.build_bundle(config, tp, sp, recipe, label, notes=notes,
                                warnings=warnings, **options)
    if key in _BUILT:
        answers.append("process")
    elif (kept := _read_run(key)) is not None:
        answers.append("run")
        _BUILT[key] = kept
    else:
        answers.append("built")
        told: list[str] = []
        warned: list[Finding] = []
        files = api.build_bundle(config, tp, sp, recipe, label, notes=told, warnings=warned,
                                 **options)
        _BUILT[key] = dict(files), tuple(told), tuple(warned)
        _keep_run(key, _BUILT[key])
    files, told, warned = _BUILT[key]
    if notes is not None:
        notes.extend(told)
    if warnings is not None:
        warnings.extend(warned)
    return dict(files)


def write_artifact(out: Path, config: Mapping[str, Any], tp: int, sp: bool, label: str,
                   **options: Any) -> Path:
    """``out`` (a fresh directory) holding :func:`build_bundle`'s files for these
    arguments (no recipe), as :func:`hpcodegen.artifact.bundle.write_bundle` publishes it."""
    from hpcodegen.artifact.bundle import write_bundle

    write_bundle(out, build_bundle(config, tp, sp, None, label, **options))
    return out


def generate(model_dir: Path, out: Path, tp: int, sp: bool = False, **options: Any) -> Path:
    """What ``hpcodegen generate --model MODEL_DIR --tp TP [--sp] -o OUT`` writes (the
    options as :class:`hpcodegen.generate.api.GenerateArgs` names them: ``ep``, ``cp``,
    ``cp_layout``, ``cp_method``, ``ulysses``, ``loss_parallel``), from the memo: the same
    label (the config dir's name) and generation record (``inputs``: the model dir relative
    to ``out``), so two calls share a build when ``out`` sits where the model dir is alike."""
    from hpcodegen.generate.sources.recorded import generation_record
    from hpcodegen.hf import read_hf_config

    config, config_path = read_hf_config(model_dir)
    inputs = generation_record(model_dir, None, out, False, options.get("cp_method"),
                               options.get("ulysses"))
    return write_artifact(out, config, tp, sp, config_path.parent.name or "model",
                          inputs=inputs, **options)
