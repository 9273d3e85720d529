"""Check selection, the crash guard, and ``load_checked_meta`` (the runtime's gate)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

from hpcodegen.artifact.load import LoadedMeta  # noqa: E402
from hpcodegen.checks.context import CheckContext  # noqa: E402
from hpcodegen.checks.registry import CHECKS, Check, run_check, select_checks  # noqa: E402
from hpcodegen.errors import InputError, PlanError, UsageError  # noqa: E402
from hpcodegen.verify import load_checked_meta  # noqa: E402


def test_selection_keeps_registry_order_and_accepts_comma_lists() -> None:
    assert select_checks() == list(CHECKS)
    assert select_checks(["plan,schema"]) == ["schema", "plan"]
    assert select_checks((), ["model", "signature"]) == ["schema", "plan", "targets", "outputs",
                                                         "source"]


@pytest.mark.parametrize(("only", "skip", "code"), [
    (["nope"], [], "usage.unknown_check"), ([], ["schema,bogus"], "usage.unknown_check"),
    (["plan"], ["plan"], "usage.no_checks"),
])
def test_bad_selection_is_a_usage_error(only: list[str], skip: list[str], code: str) -> None:
    with pytest.raises(UsageError) as exc:
        select_checks(only, skip)
    assert exc.value.exit_code == 2 and exc.value.findings[0].code == code


def test_a_crashing_check_becomes_an_internal_error_finding() -> None:
    def boom(ctx: CheckContext):
        yield from ()
        raise RuntimeError("bug")

    ctx = CheckContext(LoadedMeta({}, Path("/x/codegen_meta.json"), Path("/x")))
    result = run_check(Check("boom", boom, "test"), ctx, strict=False)
    assert result.status == "fail"
    assert [(f.code, f.message) for f in result.findings] == [
        ("boom.internal", "the boom check crashed: RuntimeError: bug")]


def test_load_checked_meta_returns_a_good_meta(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    loaded = load_checked_meta(art)
    assert loaded.meta_path == art / "codegen_meta.json" and "param_plan" in loaded.data


def test_load_checked_meta_refuses_drift_with_findings(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    (art / vf.modeling_name(art)).write_text("import os\n")
    with pytest.raises(PlanError) as exc:
        load_checked_meta(art)
    assert [f.where for f in exc.value.findings] == ["/outputs/modeling/sha256",
                                                      "/outputs/modeling/lines"]
    assert exc.value.exit_code == 1
    assert load_checked_meta(art, checks=("schema", "plan")).data


def test_load_checked_meta_on_unreadable_input(tmp_path: Path) -> None:
    with pytest.raises(InputError) as exc:
        load_checked_meta(tmp_path / "missing")
    assert exc.value.findings[0].code == "load.not_found"


def test_load_checked_meta_signature_with_a_config_dict(tmp_path: Path) -> None:
    art = vf.build_fixture("llama_hp", tmp_path / "a")
    config = dict(vf.LLAMA_CONFIG, hidden_size=128)
    with pytest.raises(PlanError) as exc:
        load_checked_meta(art, checks=("signature",), hf_config=config)
    assert ("signature.structure", "/source/structure/hidden_size") in {
        (f.code, f.where) for f in exc.value.findings}
