"""The ``outputs`` check: the artifact's files are the ones generation recorded.

Each ``meta.outputs`` key (a role or a relative file name) must name a plain file inside the
artifact dir, with the recorded sha256 and line count; the ``modeling``, ``diff`` and
``init`` roles are required. Unrecorded code (``*.py``, ``*.pyc``, extension modules, any
``__pycache__`` dir) is an error: nothing checked it, and a path-based import would run it;
other unrecorded files are warnings. For metas written by hpcodegen, the signature is
recomputed from the meta itself, so a hand-edited plan is caught even though the meta does
not hash itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from hpcodegen.artifact.digest import bytes_digest, is_hpcodegen_meta, meta_signature
from hpcodegen.artifact.load import META_NAME
from hpcodegen.checks.context import CheckContext, as_dict, as_list, pointer
from hpcodegen.checks.files import (
    ROLES,
    RecordedFileError,
    is_code,
    modeling_files,
    present_files,
    read_recorded,
    role_file_name,
)
from hpcodegen.checks.forms import signable
from hpcodegen.errors import Finding, error, warning


def _check_one(ctx: CheckContext, key: str, name: str, recorded: object) -> Iterator[Finding]:
    where = pointer("outputs", key)
    try:
        actual = bytes_digest(read_recorded(ctx.artifact_dir, name))
    except RecordedFileError as exc:
        unsafe = exc.rule == "unsafe_name"
        yield error(f"outputs.{exc.rule}", where, str(exc),
                    expected="a relative name inside the artifact dir" if unsafe else None,
                    file=None if unsafe else str(ctx.artifact_dir / name),
                    hint="regenerate the artifact" if exc.rule == "missing_file" else None)
        return
    path = ctx.artifact_dir / name
    rec = as_dict(recorded)
    for field in ("sha256", "lines"):
        if field in rec and rec[field] != actual[field]:
            yield error(f"outputs.{field}_drift", pointer("outputs", key, field),
                        f"{name} changed since generation: recorded {field} {rec[field]}, "
                        f"actual {actual[field]}", expected=str(rec[field]), file=str(path),
                        hint="regenerate the artifact, or restore the file")


def _check_signature(ctx: CheckContext) -> Iterator[Finding]:
    meta = ctx.meta
    stored = meta.get("signature")
    if not is_hpcodegen_meta(meta) or not isinstance(stored, str) or not signable(ctx):
        return
    actual = meta_signature(meta)
    if actual != stored:
        yield error("outputs.signature_drift", pointer("signature"),
                    f"the meta's plan no longer matches its signature: recorded {stored}, "
                    f"recomputed {actual}", expected=actual,
                    hint="the meta was edited after generation; regenerate the artifact")


def check_outputs(ctx: CheckContext) -> Iterator[Finding]:
    """Recorded files exist inside the dir and match; required roles; extra files warned."""
    ctx.require_artifact_dir()
    outputs = as_dict(ctx.meta.get("outputs"))
    found = modeling_files(ctx.artifact_dir)
    modeling: Path | None = found[0] if len(found) == 1 else None
    recorded_names: set[str] = set()
    for role in ROLES:
        if role not in outputs:
            yield error("outputs.missing_role", pointer("outputs", role),
                        f"outputs has no {role!r} entry", hint="regenerate the artifact")
    for key, recorded in outputs.items():
        name = role_file_name(key, modeling)
        if name is None:
            yield error("outputs.no_modeling_file", pointer("outputs", key),
                        f"{len(found)} modeling_*_gen_npu.py files in the artifact dir",
                        expected="exactly one", file=str(ctx.artifact_dir))
            continue
        recorded_names.add(name)
        yield from _check_one(ctx, key, name, recorded)
    for i, sibling in enumerate(as_list(ctx.meta.get("remote_siblings"))):
        if isinstance(sibling, str) and sibling not in outputs:
            yield error("outputs.sibling_unrecorded", pointer("remote_siblings", i),
                        f"remote sibling {sibling!r} has no outputs entry")
    extras = (present_files(ctx.artifact_dir) - recorded_names
              - {META_NAME, ctx.loaded.meta_path.name})
    for name in sorted(extras):
        if is_code(name):
            yield error("outputs.unrecorded_code", name, f"{name} is code in the artifact dir "
                        "that outputs does not record: nothing checked it",
                        file=str(ctx.artifact_dir),
                        hint="delete it (hpcodegen never writes or reads bytecode), or "
                             "regenerate the artifact")
        else:
            yield warning("outputs.unrecorded_file", name, f"{name} is in the artifact dir "
                          "but not recorded in outputs", file=str(ctx.artifact_dir))
    yield from _check_signature(ctx)
