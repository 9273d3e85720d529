"""Finding.render: one readable line, the location said once."""

from __future__ import annotations

from hpcodegen.errors import error


def test_render_names_file_and_pointer() -> None:
    f = error("plan.x", "/param_plan/lm_head", "bad", expected="R", file="a/codegen_meta.json")
    assert f.render() == "a/codegen_meta.json::/param_plan/lm_head: bad (expected R)"


def test_render_says_a_location_once() -> None:
    """No ``x::x`` when the pointer is the file, no ``x::: `` when there is no pointer."""
    assert error("load.not_found", "/nope", "missing", file="/nope").render() == "/nope: missing"
    assert error("recipe.schema", "", "not a list", file="r.yaml").render() == "r.yaml: not a list"
    assert error("launch.nproc", "--nproc", "--nproc 0").render() == "--nproc: --nproc 0"
    assert error("x.y", "", "plain").render() == "plain"
