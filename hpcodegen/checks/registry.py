"""The named checks of ``hpcodegen verify`` and the loop that runs them on one artifact.

``--only``/``--skip`` choose from :data:`CHECKS` by name; they always run in this order.
A check is a function ``check_*(ctx) -> Iterator[Finding]``; it raises
:class:`~hpcodegen.checks.context.SkipCheck` (before yielding) when an input it needs is absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from hpcodegen.checks.context import NEEDS_CONFIG, CheckContext, SkipCheck
from hpcodegen.checks.outputs import check_outputs
from hpcodegen.checks.plan import check_plan
from hpcodegen.checks.result import CheckResult, status_of
from hpcodegen.checks.schema import check_schema
from hpcodegen.checks.signature import check_signature, model_gate
from hpcodegen.checks.source import check_source
from hpcodegen.checks.targets import check_targets
from hpcodegen.errors import Finding, UsageError, error
from hpcodegen.gc_pause import paused_gc


@dataclass(frozen=True)
class Check:
    """A named check: its function and a one-line summary for ``--help`` and docs."""

    name: str
    run: Callable[[CheckContext], Iterator[Finding]]
    summary: str
    #: needs torch and transformers (and so seconds, not milliseconds)
    heavy: bool = False
    #: decides the check's result without running it (given the selected check names),
    #: when an earlier finding makes every finding of it a consequence; None: run it
    gate: Callable[[CheckContext, Sequence[str]], CheckResult | None] | None = None


def _check_model(ctx: CheckContext) -> Iterator[Finding]:
    """:func:`hpcodegen.checks.model.check_model`, imported when it runs: the module pulls
    in the tracer, logging and threading, which the pure gate never needs (nor without a
    config, when the check is skipped before the import)."""
    if ctx.hf_config is None:
        raise SkipCheck(NEEDS_CONFIG)
    from hpcodegen.checks.model import check_model

    return check_model(ctx)


CHECKS: dict[str, Check] = {c.name: c for c in (
    Check("schema", check_schema, "the meta matches schemas/codegen_meta.schema.json"),
    Check("plan", check_plan, "placements, axes, output names and cross references"),
    Check("targets", check_targets, "injection targets are registered or under --allow-target"),
    Check("outputs", check_outputs, "recorded files exist inside the dir and match their hashes"),
    Check("source", check_source, "the modeling file's classes agree with the boundary forms"),
    Check("signature", check_signature, "made for the model of --hf-config (pure JSON)"),
    Check("model", _check_model, "the plan fits the model built from --hf-config (torch)", True,
          gate=model_gate),
)}


def _split(names: Iterable[str]) -> list[str]:
    return [n.strip() for item in names for n in item.split(",") if n.strip()]


def select_checks(only: Sequence[str] = (), skip: Sequence[str] = ()) -> list[str]:
    """Check names to run, in registry order; comma lists allowed; unknown names -> UsageError."""
    only_l, skip_l = _split(only), _split(skip)
    unknown = sorted(set(only_l + skip_l) - set(CHECKS))
    if unknown:
        raise UsageError([error("usage.unknown_check", "", f"unknown check(s): "
                                f"{', '.join(unknown)}", expected="one of " + ", ".join(CHECKS))])
    chosen = [n for n in CHECKS if (not only_l or n in only_l) and n not in skip_l]
    if not chosen:
        raise UsageError([error("usage.no_checks", "", "--only/--skip leave no check to run")])
    return chosen


def run_check(check: Check, ctx: CheckContext, strict: bool) -> CheckResult:
    """Run one check; a crash becomes an ``<name>.internal`` error, never a traceback."""
    try:
        findings = list(check.run(ctx))
    except SkipCheck as skip:
        return CheckResult(check.name, "skipped", reason=str(skip))
    except Exception as exc:  # a bug in a check must not hide the other checks' results
        findings = [error(f"{check.name}.internal", "", f"the {check.name} check crashed: "
                          f"{type(exc).__name__}: {exc}", hint="please report this")]
    findings = [f if f.file is not None else replace(f, file=ctx.meta_file) for f in findings]
    return CheckResult(check.name, status_of(findings, strict), findings)


def run_checks(ctx: CheckContext, names: Sequence[str],
               strict: bool = False) -> dict[str, CheckResult]:
    """Run the named checks in registry order on one artifact (a check's gate first)."""
    results: dict[str, CheckResult] = {}
    for name, check in CHECKS.items():
        if name in names:
            gated = check.gate(ctx, names) if check.gate is not None else None
            if gated is not None:
                results[name] = gated
            elif check.heavy:  # torch's modules hold cycles: the collector stays on
                results[name] = run_check(check, ctx, strict)
            else:
                with paused_gc():  # pure checks build trees only (hpcodegen.gc_pause)
                    results[name] = run_check(check, ctx, strict)
    return results
