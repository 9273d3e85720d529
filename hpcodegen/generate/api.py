"""``hpcodegen generate``: HF config (+ recipe) -> a frozen, reviewable artifact bundle.

Steps, in order:

1. check the config divides ``tp`` (heads, kv heads, MLP width, vocab);
2. build the model on the meta device and read transformers' own TP plan (where it names
   no layer, seed one from the model's structure: :mod:`.seeds`), plus the rules the
   package ships for the ``model_type`` (:mod:`.package_rules`; they win): :mod:`.plan_sources`;
3. lift the per-Linear styles to module boundaries (:mod:`.lift`), apply the package's and
   then the user's recipe, and plan every parameter no rule names as replicated;
4. check coverage (every trainable parameter exactly once) and per-class contracts; with
   ``--loss-parallel``, that tp > 1, the head stays vocab-sharded and the forward only
   applies elementwise steps to its logits (:mod:`hpcodegen.plan.loss_parallel`, the rule
   verify and the runtime apply too); without it, that no head is left vocab-sharded;
5. freeze the meta, classify every entry (the one classifier), emit the modeling module with
   libcst, its diff against the transformers source and ``__init__.py``;
6. render the bundle and write it atomically, or compare it with disk (``--check``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from hpcodegen.artifact.bundle import diff_bundle, render_bundle
from hpcodegen.artifact.load import META_NAME
from hpcodegen.errors import (
    EXIT_FAILED,
    EXIT_OK,
    Finding,
    HpcodegenError,
    PlanError,
    Severity,
    UsageError,
    error,
)
from hpcodegen.generate.checks.frozen_check import verify_frozen
from hpcodegen.generate.checks.layer_split import rules_in_use, unsplit_layers
from hpcodegen.generate.checks.sp_check import check_sp_shapes
from hpcodegen.generate.checks.sp_nesting import check_nested_gathers
from hpcodegen.generate.checks.validate import (
    check_class_contracts,
    check_coverage,
    check_divisible,
    check_even_shards,
    check_sequence_parallel,
)
from hpcodegen.generate.emit.emit import emit_modeling
from hpcodegen.generate.emit.freeze import (
    build_meta,
    modeling_file_name,
    parallel_dims,
    source_record,
)
from hpcodegen.generate.emit.modeling_text import (
    INIT_TEXT,
    banner_lines,
    class_plans,
    defined_classes,
    unified_diff,
)
from hpcodegen.generate.emit.source import modeling_source
from hpcodegen.generate.layouts.cost import cost_note
from hpcodegen.generate.layouts.cp_method import check_method
from hpcodegen.generate.layouts.cp_plan import (
    add_cp_axis,
    check_cp_model,
    check_layout,
    default_layout,
)
from hpcodegen.generate.layouts.token_dims import retarget_token_dims
from hpcodegen.generate.publish.publish import locate, publish, report_text
from hpcodegen.generate.sources.globs import parent_of
from hpcodegen.generate.sources.hf_plan import hf_rules
from hpcodegen.generate.sources.package_rules import PackageRules
from hpcodegen.generate.sources.plan_sources import model_rules, plan_sources, tied_pairs_of
from hpcodegen.generate.sources.recipe import load_recipe, recipe_target_findings
from hpcodegen.hf import is_hub_id, read_hf_config, source_from_config
from hpcodegen.plan.codec import plan_from_meta
from hpcodegen.plan.draft import DraftPlan
from hpcodegen.plan.frozen import FrozenMap
from hpcodegen.plan.tp_divisible import HEAD_FIELDS
from hpcodegen.plan.types import PlanEntry
from hpcodegen.report.envelope import emit


@dataclass(frozen=True)
class GenerateArgs:
    """The generation inputs (what the CLI parses)."""

    #: ``--model``; None (the CLI without it): with ``check``, the one the meta records
    model_dir: Path | None
    #: ``--tp``; None: with ``check``, the meta's ``parallel_dims.tp_size``
    tp: int | None
    #: ``-o`` (or ``--check DIR``)
    out: Path | None
    sp: bool = False
    recipe: Path | None = None
    check: bool = False
    #: None: with ``check``, the meta's; else 1
    ep: int | None = 1
    #: keep the output head's logits vocab-sharded (``parallel_dims.loss_parallel``)
    loss_parallel: bool = False
    #: print the JSON envelope (docs/json.md) instead of text
    as_json: bool = False
    #: -1 quiet (errors only), 0 normal, 1 verbose (every file with its size)
    verbosity: int = 0
    #: module prefixes trusted for injection targets (as ``launch --allow-target``)
    allow_target: tuple[str, ...] = ()
    #: context-parallel degree (the sequence cut over cp ranks; docs/cp.md); None as ``ep``
    cp: int | None = 1
    #: ``headtail`` / ``contiguous``; None: head-tail for causal models
    cp_layout: str | None = None
    #: ``allgather`` / ``ulysses`` / ``hybrid`` / ``auto`` (:mod:`.cp_method`); None: with
    #: ``check``, the one the meta records, else allgather
    cp_method: str | None = "allgather"
    #: the hybrid's Ulysses degree (``--ulysses``)
    ulysses: int | None = None
    #: a warning (a plan that splits no layer) refuses the artifact: exit 1, nothing written
    strict: bool = False
    #: the ``--pp`` options (:class:`hpcodegen.generate.layouts.pipeline.PipelineArgs`); None: no pp
    pipeline: Any = None


def build_bundle(config: Mapping[str, Any], tp: int, sp: bool,
                 recipe: Sequence[Mapping[str, Any]] | None, label: str,
                 advance: Callable[[str], None] = lambda _step: None,
                 ep: int = 1, notes: list[str] | None = None,
                 loss_parallel: bool = False,
                 warnings: list[Finding] | None = None, cp: int = 1,
                 cp_layout: str | None = None, cp_method: str = "allgather",
                 ulysses: int | None = None,
                 inputs: Mapping[str, Any] | None = None,
                 pipeline: Any = None) -> dict[str, bytes]:
    """Every file of the artifact as bytes (nothing written); see the module docstring.

    ``advance(step)`` is called as each slow step starts (the CLI's progress display);
    ``notes`` receives a line naming the package rules used, if any, and one naming the HF
    plan rules that match no module; ``warnings`` what the plan is legal but likely not
    meant to be (a plan that splits no layer: :mod:`.layer_split`); ``inputs`` the
    generation record the meta keeps (:mod:`.recorded`; none when not given).
    """
    from hpcodegen.bounds import MAX_RANKS, int_problem
    from hpcodegen.hf import build_meta_model

    sizes = int_problem("generate.tp", "--tp", tp, 1, MAX_RANKS) + int_problem(
        "generate.ep", "--ep", ep, 1, MAX_RANKS) + int_problem("generate.cp", "--cp", cp, 1,
                                                               MAX_RANKS)
    if sizes:
        raise UsageError(sizes)
    check_layout(cp_layout)
    check_method(cp_method, ulysses, cp)
    if pipeline is not None:
        from hpcodegen.generate.layouts.pipeline import check_pp_args

        check_pp_args(pipeline)
    advance("building the model on the meta device")
    model = build_meta_model(config)
    rules = model_rules(config, model, tp)
    # heads are checked once the plan says whether it splits them (plan.tp_divisible)
    check_divisible(config, tp, (*(rules.unsplit_fields if rules is not None else ()),
                                 *(name for name, _ in HEAD_FIELDS)))
    if sp and rules is not None and rules.no_sp:
        raise PlanError([error("generate.sp_unsupported", "--sp",
                               f"--sp cannot run with these rules: {rules.no_sp}",
                               hint="generate without --sp", file=rules.file)])
    advance("lifting the TP plan and applying the recipe")
    modules = dict(model.named_modules())
    if rules is not None and notes is not None:
        notes.append(rules.describe())
    plan, injections, experts, layouts = plan_sources(model, sp, recipe, rules, ep,
                                                      loss_parallel, notes)
    moe_blocks = sorted({parent_of(fqn) for fqn in experts})
    if sp:
        retarget_token_dims(model, plan, moe_blocks)
    classes = {fqn: type(modules[fqn]).__name__ for fqn in plan}
    typed = plan.view()  # the typed entries the checks read (the draft stays open)
    check_coverage(model, typed)
    check_divisible(config, tp, rules.unsplit_fields if rules is not None else (), typed)
    check_even_shards(model, typed, tp)
    if sp:
        check_sequence_parallel(typed, classes, moe_blocks)
        check_nested_gathers(typed)
        check_sp_shapes(model, typed, tp, classes)
    if cp > 1:
        injections, cp_layout = _with_cp(model, config, plan, injections, cp_layout, classes,
                                         (cp_method, ulysses, cp, tp), notes)
    # the passes are done: the plan is frozen once, the rest reads the typed entries
    entries = plan.freeze()
    _check_loss_parallel(model, entries, tp, sp, ep, loss_parallel, notes)
    degenerate = unsplit_layers(model, entries, tp, rules_in_use(
        model, hf_rules(model), rules.file if rules is not None else None, recipe))
    if degenerate is not None and warnings is not None:
        warnings.append(degenerate)
    advance("emitting the modeling module")
    src = modeling_source(type(model))
    check_class_contracts(entries, classes, defined_classes(src.text))
    tied = tied_pairs_of(config, model)
    section = None
    if pipeline is not None:
        from hpcodegen.generate.layouts.pipeline import pipeline_section

        section = pipeline_section(model, entries, tp, sp, pipeline, tied, notes, cp=cp)
    meta = build_meta(config=config, tp=tp, sp=sp, entries=entries, classes=classes,
                      injections=injections, tied_pairs=tied,
                      source=source_record(config, src, source_from_config(config)),
                      recipe=_digest_recipe(recipe, rules), ep=ep,
                      loss_parallel=loss_parallel, cp=cp, cp_layout=cp_layout,
                      cp_method=cp_method if ulysses is None else f"{cp_method}:{ulysses}",
                      inputs=inputs, pipeline=section)
    frozen = plan_from_meta(meta)  # the meta's one reading: emit and the cost note share it
    kept = {fqn: why for fqn, why in layouts.kept.items() if fqn in plan or any(
        f.startswith(f"{fqn}.") for f in plan)}
    if kept and tp > 1 and notes is not None:
        notes.append(cost_note(model, config, frozen, kept, tp, sp, ep))
    name = modeling_file_name(meta["model_name"])
    text, _ = emit_modeling(src.text, src.module_name, class_plans(frozen, classes),
                            banner_lines(label, frozen, src))
    files = {
        name: text.encode("utf-8"),
        f"{name}.diff": unified_diff(src.text, text, src.file_path, name).encode("utf-8"),
        "__init__.py": INIT_TEXT.encode("utf-8"),
    }
    roles = {name: "modeling", f"{name}.diff": "diff", "__init__.py": "init"}
    rendered = render_bundle(files, roles, meta)
    verify_frozen(rendered[META_NAME], defined_classes(text), modules, config)
    return rendered


def _with_cp(model: Any, config: Mapping[str, Any], plan: DraftPlan,
             injections: list[dict[str, Any]], layout: str | None,
             classes: Mapping[str, str], method: tuple[str, int | None, int, int],
             notes: list[str] | None) -> tuple[list[dict[str, Any]], str]:
    """The cp axis on the plan (:mod:`hpcodegen.generate.layouts.cp_plan`) and the frozen layout,
    after the probe forward found every attention and no other token mixer; the method
    ``(--cp-method, --ulysses, cp, tp)`` chosen by :mod:`hpcodegen.generate.layouts.cp_method`."""
    from hpcodegen.generate.layouts.cp_method import choose_method
    from hpcodegen.generate.layouts.cp_probe import probe_cp

    boundaries = [fqn for fqn, entry in plan.items() if entry.boundary]
    probe = probe_cp(model, config, boundaries)
    check_cp_model(model, config, probe)
    chosen = choose_method(probe, *method)
    if chosen.note and notes is not None:
        notes.append(chosen.note)
    return (add_cp_axis(plan, injections, probe, classes, chosen.method, chosen.ulysses),
            layout or default_layout(probe))


def _check_loss_parallel(model: Any, entries: FrozenMap[str, PlanEntry], tp: int, sp: bool,
                         ep: int, loss_parallel: bool, notes: list[str] | None) -> None:
    """verify's loss-parallel rules (:mod:`hpcodegen.plan.loss_parallel`) on the frozen
    plan. Last: the meta forward switches the model to eager attention."""
    from hpcodegen.plan.loss_parallel import plan_findings
    from hpcodegen.tracer.loss_parallel import check_declared, check_loss_parallel

    dims = plan_from_meta({"parallel_dims": parallel_dims(tp, sp, ep, True)})
    typed = replace(dims, param_plan=entries)
    if not loss_parallel:
        if tp > 1:  # with one rank the logits are whole
            check_declared(model, typed.entries)
        return
    check_loss_parallel(model, typed.entries, notes)  # first: it names the head it refuses
    problems = plan_findings(typed, "generate", ours=True)
    if problems:
        raise PlanError(problems)


def _digest_recipe(recipe: Sequence[Mapping[str, Any]] | None,
                   rules: PackageRules | None) -> Any:
    """What ``yaml_sha256`` hashes besides config, tp and sp: the user's recipe, and the
    package rules when some were used (so a changed rule file changes the digest)."""
    user = list(recipe) if recipe else None
    return user if rules is None else {"package_rules": rules.record(), "recipe": user}


def generate_artifact(args: GenerateArgs, stdout: TextIO | None = None) -> int:
    """Generate (or ``--check``) one artifact; returns the exit code.

    Raises:
        HpcodegenError: bad inputs or a plan that cannot be frozen (it carries the code).
    """
    from hpcodegen.generate.sources.recorded import complete_args, generation_record
    from hpcodegen.progress import steps

    stdout = stdout or sys.stdout
    args = complete_args(args)
    assert args.model_dir is not None and args.tp is not None and args.out is not None
    if not args.check:  # refuse an unusable -o before the seconds-long build
        publish(args.out, None)
    config, config_path = read_hf_config(args.model_dir)
    recipe = load_recipe(args.recipe) if args.recipe else None
    from hpcodegen.targets import trusted_prefixes

    prefixes = trusted_prefixes(args.allow_target)
    foreign = recipe_target_findings(recipe or [], prefixes, os.fspath(args.recipe or ""))
    if foreign:  # the runtime would refuse to load them: never write what cannot run
        raise PlanError(foreign)
    label = config_path.parent.name or "model"
    if is_hub_id(args.model_dir):  # a snapshot dir is named by its commit: show the id
        label = os.fspath(args.model_dir)
    notes: list[str] = []
    warned: list[Finding] = []
    with steps("generate", 4) as advance:
        try:
            rendered = build_bundle(config, args.tp, args.sp, recipe, label, advance,
                                    1 if args.ep is None else args.ep, notes,
                                    args.loss_parallel, warned,
                                    1 if args.cp is None else args.cp, args.cp_layout,
                                    args.cp_method or "allgather", args.ulysses,
                                    generation_record(args.model_dir, args.recipe, args.out,
                                                      is_hub_id(args.model_dir),
                                                      args.cp_method, args.ulysses,
                                                      args.pipeline.layout
                                                      if args.pipeline is not None else None),
                                    args.pipeline)
            if warned and args.strict:
                raise PlanError([replace(f, severity=Severity.ERROR,
                                         hint=f"{f.hint}; --strict refuses warnings")
                                 for f in warned])
        except HpcodegenError as exc:
            exc.findings = [locate(f, config_path, args.recipe) for f in exc.findings]
            raise
        if not args.check:
            advance(f"writing {os.fspath(args.out)}")
            publish(args.out, rendered)
    drifted = diff_bundle(args.out, rendered) if args.check else []
    code = EXIT_FAILED if drifted else EXIT_OK
    meta = json.loads(rendered[META_NAME])
    if args.as_json:
        findings = [error("generate.drift", line.split(":", 1)[0],
                          f"{os.fspath(args.out)}/{line}", file=os.fspath(args.out))
                    for line in drifted] + warned
        return emit("generate", code, findings, stdout, out=os.fspath(args.out),
                    check=args.check, written=not args.check, signature=meta["signature"],
                    files=[{"name": name, "bytes": len(data),
                            "sha256": hashlib.sha256(data).hexdigest()}
                           for name, data in sorted(rendered.items())],
                    drift=drifted,
                    inputs={"model": os.fspath(args.model_dir),
                            "recipe": None if args.recipe is None else os.fspath(args.recipe),
                            "tp": args.tp, "sp": args.sp, "ep": args.ep, "cp": args.cp,
                            "cp_layout": args.cp_layout, "loss_parallel": args.loss_parallel,
                            "cp_method": args.cp_method, "ulysses": args.ulysses},
                    package_rules=[n for n in notes if n.startswith("package rules ")],
                    notes=notes)
    if args.verbosity >= 0:
        for note in notes:
            stdout.write(f"{note}\n")
    for finding in warned:  # like verify's: on stderr, even with --quiet
        from hpcodegen.report.terminal import fold_text

        sys.stderr.write(fold_text(f"hpcodegen generate: {finding.severity}: "
                                   f"{finding.render()}") + "\n")
    report_text(args, rendered, meta["signature"], drifted, stdout)
    return code


def run_generate(args: GenerateArgs, stdout: TextIO | None = None,
                 stderr: TextIO | None = None) -> int:
    """:func:`generate_artifact` with every expected error reported as findings (on stderr,
    or as the JSON envelope on stdout with ``--json``).

    Example::

        code = run_generate(GenerateArgs(Path("examples/configs/llama"), 2, Path("out")))
    """
    from hpcodegen.report.terminal import fold_text

    stderr = stderr or sys.stderr
    try:
        return generate_artifact(args, stdout)
    except HpcodegenError as exc:
        if args.as_json:
            return emit("generate", exc.exit_code, exc.findings, stdout or sys.stdout,
                        out=None if args.out is None else os.fspath(args.out),
                        check=args.check, written=False)
        from hpcodegen.report.findings import plain_lines

        for line in plain_lines(exc.findings, lambda _f: "hpcodegen generate: "):
            stderr.write(fold_text(line) + "\n")
        return exc.exit_code


__all__ = ["GenerateArgs", "build_bundle", "generate_artifact", "run_generate"]
