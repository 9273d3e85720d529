"""``hpcodegen inspect-plan``: what a frozen plan will run, read from the meta alone.

Steps of :func:`run_inspect`, each a small function below:

1. load the meta with the verify loader (unreadable: exit 2) and gate it with verify's
   schema and plan checks when they are installed (errors: exit 1);
2. classify every entry, over the frozen axes or over ``--mesh`` (then re-validate: which
   boundaries change form on that mesh, as the runtime would decide);
3. predict each boundary's collectives, fold repeated layers, summarize;
4. with ``--hf-config``, trace boundary shapes on the meta device and add bytes per rank;
5. render as rich text or as JSON (``docs/inspect-plan.md`` documents the JSON shape).

torch is imported only in step 4.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, TextIO

from hpcodegen.artifact.load import LoadedMeta, load_meta
from hpcodegen.errors import (
    EXIT_FAILED,
    EXIT_OK,
    Finding,
    HpcodegenError,
    Severity,
    UsageError,
    error,
    pointer,
    warning,
)
from hpcodegen.gc_pause import paused_gc
from hpcodegen.inspect.options import Inspection, InspectOptions, parse_mesh
from hpcodegen.plan.classify import BoundaryForm, classify_plan, size_one_axis
from hpcodegen.plan.codec import readable_plan as codec_readable_plan
from hpcodegen.plan.fold import fold
from hpcodegen.plan.predict import (
    predict_forms,
    summarize,
    unreduced_grad_findings,
)
from hpcodegen.plan.revalidate import (
    active_plan_axes,
    live_plan_axes,
    revalidate_forms,
)
from hpcodegen.plan.types import Plan
from hpcodegen.plan.volume import dtype_bytes

#: the verify checks run before predicting (pure, milliseconds)
GATE_CHECKS = ("schema", "plan", "targets")


def _check_options(opts: InspectOptions) -> None:
    """Usage errors (exit 2) before anything is read."""
    if opts.mesh is not None:
        parse_mesh(opts.mesh)
    volume_args = {"--batch": opts.batch, "--seq": opts.seq}
    dtype_bytes(opts.dtype)  # an unknown --dtype is an error with or without --hf-config
    if opts.hf_config is not None:
        from hpcodegen.extras import require

        require("runtime", "inspect-plan --hf-config (the volume trace)", ("torch", "transformers"))
    if opts.hf_config is None:
        given = {"--batch": opts.batch, "--seq": opts.seq, "--link-gbps": opts.link_gbps,
                 "--link-latency-us": opts.link_latency_us}
        for flag, value in given.items():
            if value is not None:  # would be ignored: the user expects bytes they won't get
                raise UsageError([error("inspect.usage", flag,
                                        f"{flag} needs --hf-config (a volume estimate)")])
        return
    from hpcodegen.bounds import MAX_BATCH, MAX_SEQ, MAX_TOKENS, float_problem, int_problem

    for flag, value in volume_args.items():
        if value is None:
            raise UsageError([error("inspect.usage", flag,
                                    f"{flag} is required with --hf-config",
                                    expected="a positive integer")])
    problems = (int_problem("inspect.usage", "--batch", opts.batch, 1, MAX_BATCH)
                + int_problem("inspect.usage", "--seq", opts.seq, 1, MAX_SEQ)
                + float_problem("inspect.usage", "--link-gbps", opts.link_gbps, 0, 1e9,
                                low_open=True))
    if not problems and opts.batch * opts.seq > MAX_TOKENS:  # type: ignore[operator]
        problems = [error("inspect.usage", "--batch/--seq", f"{opts.batch} x {opts.seq} "
                          "tokens in one batch", expected=f"at most {MAX_TOKENS} tokens")]
    if not problems and opts.link_latency_us is not None:
        if opts.link_gbps is None:
            problems = [error("inspect.usage", "--link-latency-us",
                              "--link-latency-us needs --link-gbps (the time estimate)")]
        else:
            problems = float_problem("inspect.usage", "--link-latency-us",
                                     opts.link_latency_us, 0, 1e9)
    if problems:
        raise UsageError(problems)


def gate_findings(loaded: LoadedMeta, hf_config: str | None = None,
                  keep: dict[str, Any] | None = None) -> list[Finding]:
    """verify's schema and plan checks; errors stop inspect-plan, warnings are shown.

    inspect-plan reads plans that verify accepts; a plan verify rejects is reported with
    verify's own findings (exit 1) before anything is predicted. With ``--hf-config``,
    verify's ``signature`` check too: bytes traced from another model's config (another
    architecture or hidden size) would be wrong numbers that look right.
    """
    from hpcodegen.checks.context import CheckContext
    from hpcodegen.checks.registry import CHECKS, run_check

    names = GATE_CHECKS
    config, config_path = None, None
    if hf_config is not None:
        from hpcodegen.hf import read_hf_config

        config, config_path = read_hf_config(hf_config)
        names = (*GATE_CHECKS, "signature")
    ctx = CheckContext(loaded, config, config_path)
    findings: list[Finding] = []
    for name in names:
        findings.extend(run_check(CHECKS[name], ctx, strict=False).findings)
    if keep is not None and "plan" in ctx.cache:  # the typed plan the checks built, reused
        keep["plan"] = (ctx.cache["plan"], ctx.cache["plan_left_out"])
        keep["forms"] = ctx.cache.get("forms")  # the plan check's classification (or None)
    return [f for f in findings if f.severity is not Severity.INFO]


def mesh_fit_findings(plan: Plan, opts: InspectOptions) -> list[Finding]:
    """Heads, kv heads and sharded widths against the tp size inspect-plan shows.

    The rule is generate's (:func:`hpcodegen.plan.tp_divisible.tp_divisibility`): heads that
    do not divide tp are an error (attention cannot run), an uneven width a warning. The sizes
    come from ``--hf-config`` when given, else from the meta's ``source.structure`` (generate
    records them); the tp size from ``--mesh`` when given, else the frozen one.
    """
    from hpcodegen.plan.frozen import thaw_json
    from hpcodegen.plan.tp_divisible import tp_divisibility

    if opts.mesh is not None:
        _, live = parse_mesh(opts.mesh)
        tp, where = live.get("tp"), "--mesh"
    else:
        tp, where = plan.dims.sizes.get("tp"), "/parallel_dims/tp_size"
    if not tp or tp <= 1:
        return []
    source = plan.provenance.source
    if opts.hf_config is not None:
        from hpcodegen.hf import read_hf_config

        config, path = read_hf_config(opts.hf_config)
        origin = str(path)
    else:
        if source is None or source.structure is None:
            return []
        from hpcodegen.hf import structure_config

        config = structure_config(thaw_json(source.structure))
        origin = "source.structure of the meta"
    return [replace(f, file=f.file or (origin if opts.hf_config else None),
                    message=f"{f.message}, from {origin}" if not opts.hf_config else f.message)
            for f in tp_divisibility(config, tp, "inspect", where, plan=plan.entries)]


def classify_meta(plan: Plan, mesh: str | None,
                  forms: dict[str, BoundaryForm] | None = None) -> Inspection:
    """Classify and predict every entry, over the frozen mesh or over ``--mesh`` (then
    re-validated: which boundaries change form there, as the runtime decides).

    ``forms``: the plan check's classification of this plan over its own axes, reused when
    no axis has size 1 (then the sizes change nothing: :func:`size_one_axis`)."""
    frozen_axes = plan.axes
    sizes = dict(plan.dims.sizes)
    if mesh is None:
        # a size-1 axis runs nothing (the runtime drops it): classified as such
        frozen = forms if forms is not None and not size_one_axis(frozen_axes, sizes) \
            else classify_plan(plan, sizes=sizes)
        tp_live = "tp" in frozen_axes and sizes.get("tp", 1) > 1
        preds = predict_forms(plan, frozen, tp_live=tp_live)
        problems = unreduced_grad_findings(plan, preds, tp_live)
        if frozen_axes and all(sizes.get(a, 1) == 1 for a in frozen_axes):
            problems.append(_size1_warning(frozen_axes, preds))
        return Inspection("", frozen_axes, {a: sizes[a] for a in frozen_axes if a in sizes},
                          preds, [], summarize(preds), findings=problems)
    frozen = classify_plan(plan)
    problems: list[Finding] = []
    live_axes, live_sizes = parse_mesh(mesh)
    check_mesh_axes(plan, mesh, live_axes)
    shown = live_plan_axes(plan, live_axes)  # the plan's axes on the live mesh, size 1 too
    axes = active_plan_axes(plan, live_axes, live_sizes)  # what the runtime installs over
    ep_live = live_sizes.get("ep", 1) > 1 and sizes.get("ep", 1) > 1
    if frozen_axes and not shown and not ep_live:  # e.g. --mesh dp=8: nothing communicates
        problems.append(warning("inspect.no_plan_axis", "--mesh",
                                f"--mesh {mesh} holds none of the plan's axes: every "
                                "boundary runs without communication",
                                expected=f"one of {', '.join(frozen_axes)}"))
    live = classify_plan(plan, axes, live_sizes)
    effective, changes = revalidate_forms(frozen, live, axes, ep_live)
    tp_live = "tp" in axes
    preds = predict_forms(plan, live, effective, tp_live=tp_live, ep_live=ep_live)
    problems += unreduced_grad_findings(plan, preds, tp_live)
    shown_sizes = {a: live_sizes[a] for a in shown}
    return Inspection("", shown, shown_sizes, preds, [], summarize(preds), changes,
                      findings=problems)


def known_mesh_axes(plan: Plan) -> tuple[str, ...]:
    """The axis names a live mesh for this plan may have: the plan's own mesh axes, the
    axes its ``parallel_dims`` sizes (``dp``, ``tp``, ``cp``, ``ep``, ``pp``) and the
    data-parallel / FSDP axes the runtime leaves to the user (``FSDP_AXES``)."""
    from hpcodegen.plan.revalidate import FSDP_AXES

    named = [*plan.axes, *(plan.mesh_dim_names or ()), *plan.dims.sizes]
    return tuple(dict.fromkeys([*named, *sorted(FSDP_AXES)]))


def check_mesh_axes(plan: Plan, mesh: str, live_axes: Sequence[str],
                    verb: str = "inspect") -> None:
    """An axis of ``--mesh`` the plan cannot have (a typo such as ``pt=4``) is a usage
    error (exit 2) naming the axes the plan has: a prediction over it would silently show
    a mesh that communicates nothing."""
    known = known_mesh_axes(plan)
    unknown = [a for a in live_axes if a not in known]
    if not unknown:
        return
    own = list(dict.fromkeys([*plan.axes, *(a for a, n in plan.dims.sizes.items() if n > 1)]))
    raise UsageError([error(
        f"{verb}.unknown_mesh_axis", "--mesh",
        f"--mesh {mesh}: unknown axis {', '.join(repr(a) for a in unknown)}; the plan's "
        f"axes are {', '.join(own) or '(none)'}",
        expected=f"axes among {', '.join(known)}",
        hint=f"e.g. --mesh {','.join(f'{a}={plan.dims.sizes.get(a, 2)}' for a in own) or 'tp=2'}")])


def _size1_warning(axes: Sequence[str], preds: Sequence[Any]) -> Finding:
    """The frozen dense axes all have size 1: the runtime installs nothing on them (an
    exact no-op), except the expert dispatch of an ``--ep`` plan, which runs on its own
    ``ep`` axis; either way the table shows what runs on this mesh."""
    frozen_mesh = ",".join(f"{a}=1" for a in axes)
    dispatch = sum(1 for p in preds if p.form == "region" and any(
        op.axis == "ep" for op in p.in_ops + p.out_ops))
    what = (f"the runtime installs only the expert dispatch of {dispatch} MoE layer(s), "
            "over ep" if dispatch else "the runtime installs nothing")
    return warning("inspect.size1_mesh", "/parallel_dims",
                   f"the frozen mesh is {frozen_mesh}: {what}; the collectives below are "
                   "those that run there", hint="pass --mesh (e.g. --mesh tp=2) to see a "
                   "given live mesh")


def readable_plan(loaded: LoadedMeta, built: tuple[Plan, list[Any]] | None = None
                  ) -> tuple[Plan, list[Finding]]:
    """The typed plan inspect-plan reads, and what had to be left out to build it.

    A meta verify's gate let through builds at once. With ``--no-checks`` a part the codec
    refuses is left out (:func:`hpcodegen.plan.codec.readable_plan`, the one reader of the
    JSON) rather than crashing a reader: a ``param_plan`` entry as an error
    (``inspect.bad_entry``: it is not predicted), an injection record or another top-level
    field as a warning (``inspect.ignored_field``, once per field).
    """
    plan, left_out = built if built is not None else codec_readable_plan(loaded.data)
    findings: list[Finding] = []
    ignored: set[str] = set()
    for exc in left_out:
        key, *rest = exc.path
        if key == "param_plan" and rest:
            findings.append(error("inspect.bad_entry", pointer("param_plan", rest[0]),
                                  f"cannot classify {rest[0]!r}: {exc.message}",
                                  hint="run `hpcodegen verify` for the full diagnosis"))
        elif key not in ignored:
            ignored.add(key)
            findings.append(warning("inspect.ignored_field", f"/{key}",
                                    f"{key} has an unexpected shape and was ignored",
                                    hint="run `hpcodegen verify` for the schema errors"))
    return plan, findings


def inspect_plan(plan: Plan, meta_path: str, opts: InspectOptions,
                 forms: dict[str, BoundaryForm] | None = None) -> Inspection:
    """Steps 2-4 on a typed plan (no rendering); ``forms`` as in :func:`classify_meta`."""
    result = classify_meta(plan, opts.mesh, forms)
    result.meta_path = meta_path
    # parameter-only entries have no row; they never fold with a boundary (the form is in
    # a row's signature), so they are left out before folding, not after
    result.rows = fold([p for p in result.preds if p.form != "params"], opts.expand)
    result.findings.extend(result.summary.problems)
    result.loss_parallel_heads = plan.vocab_sharded_heads()
    if opts.hf_config is not None:
        from hpcodegen.inspect.volume import volume_report

        result.volume = volume_report(plan, result, opts)
    result.pipeline = _pipeline(plan, opts)
    return result


def _pipeline(plan: Plan, opts: InspectOptions) -> dict[str, Any] | None:
    """The pipeline report (and ``--timeline`` file) of a pipelined plan."""
    if plan.pipeline is None and opts.timeline is None:
        return None  # the report of a plan without a pipeline (no schedule module imported)
    from hpcodegen.inspect.pipeline import pipeline_report, write_timeline

    if opts.timeline is not None:
        write_timeline(plan.pipeline, opts.timeline)
    config = None
    if opts.hf_config is not None:
        from hpcodegen.hf import read_hf_config

        config = read_hf_config(opts.hf_config)[0]
    return pipeline_report(plan, config=config, batch=opts.batch, seq=opts.seq,
                           element_bytes=dtype_bytes(opts.dtype))


def inspect_meta(loaded: LoadedMeta, opts: InspectOptions) -> Inspection:
    """:func:`inspect_plan` on a loaded meta (its :func:`readable_plan`)."""
    plan, ignored = readable_plan(loaded)
    result = inspect_plan(plan, str(loaded.meta_path), opts)
    result.findings[:0] = ignored
    return result


def _emit_failure(findings: Sequence[Finding], as_json: bool, out: TextIO, err: TextIO,
                  exit_code: int) -> int:
    from hpcodegen.inspect.render import print_findings, render_failure_json

    if as_json:
        render_failure_json(findings, out, exit_code)
    else:
        print_findings(findings, err)
    return exit_code


def run_inspect(opts: InspectOptions, out: TextIO | None = None,
                err: TextIO | None = None) -> int:
    """Run ``inspect-plan``; returns the exit code (0 ok, 1 plan errors, 2 usage/unreadable).

    Example::

        code = run_inspect(InspectOptions(path="examples/llama_tp2", as_json=True))
    """
    out = out or sys.stdout
    err = err or sys.stderr
    # pure steps build trees only (hpcodegen.gc_pause); with --hf-config torch runs here
    with paused_gc() if opts.hf_config is None else nullcontext():
        return _run_inspect(opts, out, err)


def _run_inspect(opts: InspectOptions, out: TextIO, err: TextIO) -> int:
    try:
        _check_options(opts)
        loaded = load_meta(opts.path)
        kept: dict[str, Any] = {}
        gate = gate_findings(loaded, opts.hf_config, kept) if opts.checks else []
        if any(f.severity is Severity.ERROR for f in gate):
            return _emit_failure(gate, opts.as_json, out, err, EXIT_FAILED)
        entries = loaded.data.get("param_plan")
        if not isinstance(entries, Mapping) or not entries:
            empty = error("inspect.empty_plan", "/param_plan", "the meta has no param_plan",
                          file=str(loaded.meta_path))
            return _emit_failure([empty], opts.as_json, out, err, EXIT_FAILED)
        # built once (by the gate's checks when they ran), read by every step below
        plan, ignored = readable_plan(loaded, kept.get("plan"))
        # heads vs the shown tp: errors fail the run (exit 1) but the prediction is still
        # shown; they are reported too when the meta-device trace itself fails
        fit = mesh_fit_findings(plan, opts)
        try:
            result = inspect_plan(plan, str(loaded.meta_path), opts, kept.get("forms"))
        except HpcodegenError as exc:
            return _emit_failure([*fit, *ignored, *exc.findings], opts.as_json, out, err,
                                 exc.exit_code)
        result.findings[:0] = gate + fit + ignored
    except HpcodegenError as exc:
        return _emit_failure(exc.findings, opts.as_json, out, err, exc.exit_code)
    failed = any(f.severity is Severity.ERROR for f in result.findings)
    from hpcodegen.inspect.render import render_json, render_text
    from hpcodegen.report.terminal import reader_gone

    try:
        if opts.as_json:
            render_json(result, out)
        else:
            render_text(result, out, err, opts.verbosity)
            out.flush()
    except BrokenPipeError:  # `inspect-plan ... | head -1`: the reader has what it wanted
        reader_gone()
    return EXIT_FAILED if failed else EXIT_OK
