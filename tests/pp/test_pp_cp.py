"""pp x cp in the frozen pipeline section: with cp > 1 the hidden states cross a stage
boundary sequence-sharded over cp (``S(1)``), verify refuses a boundary that says otherwise
(and a cp placement on a plan without cp), and inspect-plan's p2p bytes per microbatch are
divided by every axis the boundary shards the sequence over. Pure: no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_check_pipeline import errors, pp_meta

from hpcodegen.inspect.pipeline import activation_elements
from hpcodegen.plan.codec import plan_from_meta
from hpcodegen.plan.pipeline import boundary_placements

HERE = str(Path(__file__).resolve().parent)

CP_WHERE = "/pipeline/boundary/placements/cp"
CONFIG = {"hidden_size": 64}


def _with_cp(cp: int, placements: dict[str, str]) -> dict:
    meta = pp_meta()
    meta["parallel_dims"]["cp_size"] = cp
    meta["pipeline"]["boundary"]["placements"] = placements
    return meta


@pytest.mark.parametrize(("sp", "cp", "want"), [
    (False, 1, {}), (True, 1, {"tp": "S(1)"}), (False, 2, {"cp": "S(1)"}),
    (True, 4, {"tp": "S(1)", "cp": "S(1)"})])
def test_the_boundary_rule(sp, cp, want):
    assert boundary_placements(sp=sp, cp=cp) == want


def test_cp_boundary_sharded_on_the_sequence_passes():
    found = errors(_with_cp(2, {"tp": "S(1)", "cp": "S(1)"}))
    assert "plan.pp_boundary" not in found, found


@pytest.mark.parametrize("sent", [None, "R", "S(2)"])
def test_cp_boundary_not_sequence_sharded_is_refused(sent):
    placements = {"tp": "S(1)"} if sent is None else {"tp": "S(1)", "cp": sent}
    assert errors(_with_cp(2, placements))["plan.pp_boundary"] == [CP_WHERE]


def test_a_cp_placement_without_cp_is_refused():
    assert errors(_with_cp(1, {"tp": "S(1)", "cp": "S(1)"}))["plan.pp_boundary"] == [CP_WHERE]


def test_p2p_bytes_divide_by_every_axis_the_boundary_shards():
    def elements(cp: int, placements: dict[str, str]) -> int:
        plan = plan_from_meta(_with_cp(cp, placements))
        return activation_elements(plan, plan.pipeline, CONFIG, batch=8, seq=128)

    tp = pp_meta()["parallel_dims"]["tp_size"]
    whole = 8 // 4 * 128 * 64  # m = 4 microbatches
    assert elements(1, {}) == whole
    assert elements(1, {"tp": "S(1)"}) == whole // tp
    assert elements(2, {"tp": "S(1)", "cp": "S(1)"}) == whole // tp // 2
    assert elements(4, {"cp": "S(1)"}) == whole // 4


def test_the_cp_boundary_rule_imports_no_torch():
    code = (f"import sys; sys.path.append({HERE!r});"
            "from test_check_pipeline import errors, pp_meta;"
            "m = pp_meta(); m['parallel_dims']['cp_size'] = 2; errors(m);"
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_pp_cp_with_sequence_parallelism_gets_a_pp_cp_tp_mesh():
    """pp x cp x sp composes (``tests/pp/test_pp_loss_parallel.py`` runs it exactly): the
    launch lays out pp outermost, then cp and tp, as for pp x cp."""
    from hpcodegen.launch.rank.mesh import resolve_mesh_layout

    meta = _with_cp(2, {"tp": "S(1)", "cp": "S(1)"})
    assert meta["parallel_dims"]["sequence_parallel"] is True
    tp = meta["parallel_dims"]["tp_size"]
    layout = resolve_mesh_layout(plan_from_meta(meta), 2 * 2 * tp)
    assert layout.names[0] == "pp" and layout.names.index("cp") < layout.names.index("tp")
    assert dict(zip(layout.names, layout.sizes, strict=True))["cp"] == 2
