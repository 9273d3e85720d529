"""One ``build_bundle`` per distinct set of arguments in a test process.

Many generate tests build the same tiny family at the same options (a parametrized
per-family check, then a test reading one entry of that family's plan, in this file or
another): the build is the real one (:func:`hpcodegen.generate.api.build_bundle`), paid once
per process and keyed by the exact arguments (the config's key order included, as the meta
keeps it), so a test sees bytes equal to what its own call would have produced.

No test can alter another's result: the files come back in a fresh dict (the values are
``bytes``), the notes and warnings are replayed into the caller's lists (findings are frozen
dataclasses). A build that raises is not kept: each such call runs again, so every refusal
a test asserts is its own. Arguments that are not JSON (a test passing an object) bypass
the memo. A test that patches what the build reads (``monkeypatch``) calls the real
build instead: the key does not see the patch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hpcodegen.errors import Finding
from hpcodegen.generate import api

#: key -> (files, notes, warnings) of the first build with those arguments
_BUILT: dict[str, tuple[dict[str, bytes], tuple[str, ...], tuple[Finding, ...]]] = {}
#: calls answered from :data:`_BUILT` (the memo's own test reads it)
hits: list[str] = []


def build_bundle(config: Mapping[str, Any], tp: int, sp: bool,
                 recipe: Sequence[Mapping[str, Any]] | None, label: str, *,
                 notes: list[str] | None = None, warnings: list[Finding] | None = None,
                 **options: Any) -> dict[str, bytes]:
    """:func:`hpcodegen.generate.api.build_bundle` (same arguments, keyword options), built
    once per distinct arguments; a fresh dict of the files each call."""
    try:
        key = json.dumps([config, tp, sp, recipe, label, sorted(options.items())])
    except TypeError:  # not JSON: no exact key, so no sharing
        return api.build_bundle(config, tp, sp, recipe, label, notes=notes,
                                warnings=warnings, **options)
    if key in _BUILT:
        hits.append(key)
    else:
        told: list[str] = []
        warned: list[Finding] = []
        files = api.build_bundle(config, tp, sp, recipe, label, notes=told, warnings=warned,
                                 **options)
        _BUILT[key] = dict(files), tuple(told), tuple(warned)
    files, told, warned = _BUILT[key]
    if notes is not None:
        notes.extend(told)
    if warnings is not None:
        warnings.extend(warned)
    return dict(files)
