"""verify's own checks on the meta generate is about to write (no file is read).

Split out of :mod:`hpcodegen.generate.api`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcodegen.artifact.load import META_NAME
from hpcodegen.errors import PlanError

#: The checks of verify that read the meta alone: a meta generate writes must pass them.
FROZEN_CHECKS: tuple[str, ...] = ("schema", "plan")


def verify_frozen(meta_bytes: bytes, classes: set[str],
                  modules: Mapping[str, Any] | None = None,
                  config: Mapping[str, Any] | None = None) -> None:
    """Run verify's own ``schema`` and ``plan`` checks on the meta about to be written, and
    with the built model's ``modules`` the model check's boundary rules
    (:mod:`hpcodegen.checks.model_derived`).

    Whatever generate accepts (a recipe value included) must give a meta its own verify
    accepts: a plan that fails them is refused here (PlanError, exit 1), with verify's
    findings, instead of being written. With the model's ``config``, the derivation by
    propagation verify's model check runs (:func:`hpcodegen.checks.model.
    derivation_findings`): the plan generate writes is the plan it derived. ``classes``
    are the modeling file's classes (the plan check reads them from the file on disk,
    which does not exist yet).
    """
    from hpcodegen.artifact.load import LoadedMeta
    from hpcodegen.checks.context import CheckContext
    from hpcodegen.checks.model_derived import input_name_findings, leaf_form_findings
    from hpcodegen.checks.registry import run_checks
    from hpcodegen.errors import Severity

    data = json.loads(meta_bytes)
    missing = Path("/nonexistent/hpcodegen-unwritten")  # nothing is read from disk
    ctx = CheckContext(LoadedMeta(data, missing / META_NAME, missing))
    ctx.cache["file_classes"] = set(classes)
    found = [f for r in run_checks(ctx, FROZEN_CHECKS).values() for f in r.findings]
    if modules is not None:
        found += [*leaf_form_findings(ctx.plan, modules),
                  *input_name_findings(ctx.plan.entries, modules, set())]
    if config is not None and not any(f.severity is Severity.ERROR for f in found):
        from hpcodegen.checks.model import derivation_findings

        found += derivation_findings(ctx.plan, config, ours=True)
    errors = [replace(f, file=None, message=f"the plan to be frozen fails verify: {f.message}")
              for f in found if f.severity is Severity.ERROR]
    if errors:
        raise PlanError(errors)
