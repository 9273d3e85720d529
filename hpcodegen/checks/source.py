"""The ``source`` check: the generated modeling file agrees with the plan's boundary forms.

The file (exactly one ``modeling_*_gen_npu.py``) is parsed with :mod:`ast`, never imported.
For each class in ``boundary_classes`` that the file defines, the classifier's form decides
what the class must look like (both naming generations accepted):

* identity (and parameter-only entries): the forward is untouched, so no ``_forward_impl``
  and no form marker;
* tp_collective: ``_forward_impl`` and the marker ``_hp_boundary_form`` /
  ``_hyper_boundary_form`` = ``"tp_collective"`` (or ``"toggle"``), no generic engine call;
  a forward that fails the lowering gates (``*args``, a bare ``return`` or returns of mixed
  tuple/non-tuple shape, inputs that are not parameters, an output op not on output 0) is
  emitted generic instead: :func:`hpcodegen.plan.lowering.lowering_gates` on the
  ``_forward_impl`` (the original forward), the rule ``generate`` applies;
* generic and region: ``_forward_impl`` and no tp_collective marker.

Classes not defined in the file (``nn.Linear``) are wrapped at run time: info. A declared
entrypoint function that is absent is fine (the runtime executes from the meta): info.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hpcodegen.checks.context import CheckContext, as_dict, as_list, plan_entries
from hpcodegen.checks.files import escapes, modeling_files
from hpcodegen.checks.forms import UNCLASSIFIABLE, classified
from hpcodegen.checks.source_scan import (
    ClassInfo,
    ModuleScan,
    called_names,
    scan_module,
    self_attrs,
)
from hpcodegen.errors import Finding, error, info
from hpcodegen.plan.classify import BoundaryForm
from hpcodegen.plan.entry import TOGGLE_FORM_MARKER, TP_FORM_MARKER
from hpcodegen.plan.lowering import forward_signature, instance_wrapped, lowering_gates

MAX_SOURCE_BYTES = 32 * 1024 * 1024
_FORBIDDEN_CALLS = ("get_parallel_state", "get_inline_parallel_state")
_GENERIC_ATTRS = ("_hp_boundary", "_hyper_boundary")
_BIAS_HOOKS = ("_hp_deferred_bias", "_hyper_deferred_bias")


def read_modeling_tree(ctx: CheckContext
                       ) -> tuple[ast.Module | None, Path | None, list[Finding]]:
    """The parsed modeling file (never imported), or None and the findings saying why
    (None and none for a bare meta: its folder is never read).

    Parsed once per artifact (kept in ``ctx.cache``): the source, plan and model checks
    all read this tree, and parsing a generated file is a good part of a check's time. The
    checks only read the tree, never change it."""
    if "modeling_tree" not in ctx.cache:
        ctx.cache["modeling_tree"] = _parse_modeling_file(ctx)
    tree, path, problems = ctx.cache["modeling_tree"]
    return tree, path, list(problems)


def _parse_modeling_file(ctx: CheckContext
                         ) -> tuple[ast.Module | None, Path | None, list[Finding]]:
    if ctx.loaded.bare:
        return None, None, []
    found = modeling_files(ctx.artifact_dir)
    where = str(ctx.artifact_dir)
    if len(found) != 1:
        return None, None, [error("source.modeling_file_count", "",
                                  f"{len(found)} modeling_*_gen_npu.py files in the artifact dir",
                                  expected="exactly one", file=where)]
    path = found[0]
    if escapes(ctx.artifact_dir, path) or not path.is_file():
        return None, path, [error("source.modeling_not_plain", "", "the modeling file is not a "
                                  "plain file inside the artifact dir", file=str(path))]
    try:
        if path.stat().st_size > MAX_SOURCE_BYTES:
            return None, path, [error("source.too_large", "", "modeling file is too large",
                                      expected=f"at most {MAX_SOURCE_BYTES} bytes", file=str(path))]
        tree = ast.parse(path.read_bytes().decode("utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError) as exc:
        return None, path, [error("source.unreadable", "", f"cannot read as UTF-8: {exc}",
                                  file=str(path))]
    except (SyntaxError, ValueError, RecursionError) as exc:
        line, col = getattr(exc, "lineno", 0) or 0, getattr(exc, "offset", 0) or 0
        return None, path, [error("source.syntax", f"line {line}:{col}",
                                  f"the modeling file does not parse: {getattr(exc, 'msg', exc)}",
                                  file=str(path), hint="regenerate the artifact")]
    return tree, path, []


def _emitted_form(form: BoundaryForm, cls: ClassInfo) -> tuple[str, str]:
    """The form the generator emits for the class, and why it differs from the verdict."""
    if form.form == "params":
        return "identity", ""
    if form.form != "tp_collective":
        return form.form, ""
    original = cls.methods.get("_forward_impl") or cls.methods.get("forward")
    reasons = lowering_gates(form, forward_signature(original)) if original else []
    return ("generic", "; ".join(reasons)) if reasons else ("tp_collective", "")


def _class_findings(cls: ClassInfo, form: str, why: str, fqn: str,
                    entry: Mapping[str, Any], file: str) -> Iterator[Finding]:
    has_impl = "_forward_impl" in cls.methods
    marker = cls.marker
    where, line = cls.name, f"(line {cls.line})"
    label = f"{form} (via {fqn}{'; ' + why if why else ''})"
    if form == "identity":
        if has_impl:
            yield error("source.identity_rewritten", where, f"{cls.name} {line} is an identity "
                        f"boundary {label} but has _forward_impl", file=file,
                        hint="regenerate the artifact")
        if marker is not None:
            yield error("source.stray_marker", where, f"{cls.name} {line} is an identity boundary"
                        f" but carries the form marker {marker!r}", file=file)
        return
    if not has_impl:
        yield error("source.missing_forward_impl", where, f"{cls.name} {line} is a {label} "
                    "boundary but has no _forward_impl", file=file, hint="regenerate the artifact")
    if form == "tp_collective" and marker not in (TP_FORM_MARKER, TOGGLE_FORM_MARKER):
        yield error("source.missing_marker", where, f"{cls.name} {line} is a {label} boundary "
                    f"but its form marker is {marker!r}", expected=repr(TP_FORM_MARKER), file=file)
    if form != "tp_collective" and marker == TP_FORM_MARKER:
        yield error("source.stray_marker", where, f"{cls.name} {line} is a {label} boundary but "
                    "is marked tp_collective", file=file)
    forward = cls.methods.get("forward")
    if forward is None:
        return
    attrs, calls = self_attrs(forward), called_names(forward)
    if form == "tp_collective" and attrs & set(_GENERIC_ATTRS):
        yield error("source.generic_call_in_tp_forward", where, f"{cls.name}.forward of a "
                    "tp_collective class calls the generic boundary engine", file=file)
    for name in _FORBIDDEN_CALLS:
        if name in calls:
            yield error("source.parallel_state_call", where, f"{cls.name}.forward calls "
                        f"{name}(); generated forwards take their state from the runtime",
                        file=file)
    declared = bool(entry.get("deferred_bias_params"))
    if declared != bool(attrs & set(_BIAS_HOOKS)):
        yield error("source.deferred_bias_hook", where, f"{cls.name}.forward "
                    f"{'lacks' if declared else 'calls'} the deferred-bias hook although the "
                    f"plan {'declares' if declared else 'declares no'} deferred_bias_params",
                    file=file)


def _check_classes(ctx: CheckContext, scan: ModuleScan, file: str,
                   tree: ast.Module) -> Iterator[Finding]:
    nodes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    forms = classified(ctx)
    if forms is None:
        yield info("source.unclassified", "", UNCLASSIFIABLE)
        return
    plan = plan_entries(ctx.meta.get("param_plan"))
    by_class: dict[str, str] = {}
    for fqn, cls_name in sorted(as_dict(ctx.meta.get("boundary_classes")).items()):
        if isinstance(cls_name, str) and fqn in forms:
            by_class.setdefault(cls_name, fqn)
    for cls_name, fqn in sorted(by_class.items()):
        cls = scan.classes.get(cls_name)
        if cls is None:
            yield info("source.class_not_in_file", cls_name, f"{cls_name} (e.g. {fqn}) is not "
                       "defined in the modeling file; the runtime wraps its instances", file=file)
            continue
        node = nodes.get(cls_name)
        if "_forward_impl" not in cls.methods and cls.marker is None \
                and instance_wrapped(forms[fqn].form, node):
            yield info("source.class_wrapped", cls_name, f"{cls_name} (e.g. {fqn}) is kept as "
                       "transformers wrote it (its forward is dispatched by a decorator, or it "
                       "is a region); the runtime wraps its instances", file=file)
            continue
        form, why = _emitted_form(forms[fqn], cls)
        yield from _class_findings(cls, form, why, fqn, plan[fqn], file)


def _check_names(ctx: CheckContext, scan: ModuleScan) -> Iterator[Finding]:
    entry = as_dict(ctx.meta.get("entrypoints")).get("parallelize")
    if isinstance(entry, str) and entry not in scan.functions:
        yield info("source.entrypoint_absent", "/entrypoints/parallelize",
                   f"the modeling file defines no {entry}(); the runtime executes the plan from "
                   "the meta")
    model_class = ctx.meta.get("model_class")
    if isinstance(model_class, str) and model_class and model_class not in scan.names:
        yield error("source.model_class_missing", "/model_class", f"model class {model_class} "
                    "is not defined in the modeling file")
    for i, name in enumerate(as_list(ctx.meta.get("external_state_classes"))):
        if not isinstance(name, str):
            continue
        cls = scan.classes.get(name)
        if cls is None:
            yield error("source.external_class_missing", f"/external_state_classes/{i}",
                        f"external-state class {name} is not defined in the modeling file")
        elif cls.marker == TP_FORM_MARKER:
            yield error("source.stray_marker", name, f"external-state class {name} (line "
                        f"{cls.line}) carries the tp_collective marker; its forward is an "
                        "inline strategy body, not a lowered boundary")


def check_source(ctx: CheckContext) -> Iterator[Finding]:
    """Parse the modeling file and compare each boundary class with its classified form."""
    ctx.require_artifact_dir()
    tree, path, problems = read_modeling_tree(ctx)
    yield from problems
    if tree is None or path is None:
        return
    scan = scan_module(tree)
    yield from _check_classes(ctx, scan, str(path), tree)
    yield from _check_names(ctx, scan)
