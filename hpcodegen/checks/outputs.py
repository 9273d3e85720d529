"""The ``outputs`` check: the artifact's files are the ones generation recorded.

Each ``meta.outputs`` key (a role or a relative file name) must name a plain file inside the
artifact dir, with the recorded sha256 and line count; the ``modeling``, ``diff`` and
``init`` roles are required. Unrecorded files are warnings (``__pycache__`` is ignored). For
metas written by hpcodegen, the signature is recomputed from the meta itself, so a
hand-edited plan is caught even though the meta does not hash itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from hpcodegen.artifact.digest import file_digest, is_hpcodegen_meta, meta_signature
from hpcodegen.artifact.load import META_NAME
from hpcodegen.checks.context import CheckContext, as_dict, as_list, pointer
from hpcodegen.checks.files import (
    ROLES,
    escapes,
    modeling_files,
    present_files,
    role_file_name,
    unsafe_name_reason,
)
from hpcodegen.checks.forms import signable
from hpcodegen.errors import Finding, error, warning


def _check_one(ctx: CheckContext, key: str, name: str, recorded: object) -> Iterator[Finding]:
    where = pointer("outputs", key)
    path = ctx.artifact_dir / name
    reason = unsafe_name_reason(name)
    if reason:
        yield error("outputs.unsafe_name", where, f"output file name {name!r} {reason}",
                    expected="a relative name inside the artifact dir")
        return
    if escapes(ctx.artifact_dir, path):
        yield error("outputs.escapes", where, f"{name} links outside the artifact dir",
                    file=str(path))
        return
    if not path.exists():
        yield error("outputs.missing_file", where, f"recorded file {name} does not exist",
                    file=str(path), hint="regenerate the artifact")
        return
    if not path.is_file():
        yield error("outputs.not_a_file", where, f"{name} is not a plain file", file=str(path))
        return
    rec = as_dict(recorded)
    try:
        actual = file_digest(path)
    except OSError as exc:
        yield error("outputs.unreadable", where, f"cannot read {name}: {exc.strerror}",
                    file=str(path))
        return
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
        yield warning("outputs.unrecorded_file", name, f"{name} is in the artifact dir but not "
                      "recorded in outputs", file=str(ctx.artifact_dir))
    yield from _check_signature(ctx)
