"""tools/restage_generate.py's rewrite: every reference form points into its stage, and a
second run changes nothing (the lead re-runs it after merging other work)."""

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "restage_generate.py"
_spec = importlib.util.spec_from_file_location("restage_generate", TOOL)
restage = importlib.util.module_from_spec(_spec)
sys.modules["restage_generate"] = restage
_spec.loader.exec_module(restage)

BEFORE = '''from hpcodegen.generate import package_rules as pr, api, seeds
from hpcodegen.generate.seeds import find_seeds
from hpcodegen.generate.lift import (
    Lifter)
import hpcodegen.generate.layouts
x = "hpcodegen.generate.seeds.find_seeds"  # hpcodegen.generate.rules stays
# see hpcodegen/generate/cp_plan.py, generate/lift.py, tests/generate/test_lift.py
'''

AFTER = '''from hpcodegen.generate.sources import package_rules as pr
from hpcodegen.generate import api
from hpcodegen.generate.seeds import seeds
from hpcodegen.generate.seeds.seeds import find_seeds
from hpcodegen.generate.layouts.lift import (
    Lifter)
import hpcodegen.generate.layouts.layouts
x = "hpcodegen.generate.seeds.seeds.find_seeds"  # hpcodegen.generate.rules stays
# see hpcodegen/generate/layouts/cp_plan.py, generate/layouts/lift.py, tests/generate/test_lift.py
'''


def test_every_reference_form_points_into_its_stage() -> None:
    assert restage.rewrite(BEFORE) == AFTER


def test_a_second_run_changes_nothing() -> None:
    assert restage.rewrite(AFTER) == AFTER


def test_each_stage_names_each_module_once_and_keeps_the_top_small() -> None:
    names = [m for _doc, mods in restage.STAGES.values() for m in mods]
    assert len(names) == len(set(names))
    top = Path(restage.REPO, restage.GENERATE)
    assert len([p for p in top.glob("*.py") if p.name != "__init__.py"]) <= 12
    for stage in restage.STAGES:
        assert (top / stage / "__init__.py").read_text().startswith('"""')
