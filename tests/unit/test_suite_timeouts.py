"""The suite's own timeouts are hang guards, never a verdict on the machine's speed.

docs/testing.md ("Timeouts"): a wait on a subprocess gets at least 300 s and a test's
``pytest.mark.timeout`` at least 400 s, so a loaded 2-core machine slows the suite but
never fails it. This scan of every test file keeps a new tight value from creeping back
in. ``LaunchOptions(timeout=...)`` is exempt: it is launch's own ``--timeout`` under test,
not a wait of the suite.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MIN_WAIT_S = 300
MIN_TEST_S = 400
LAUNCH_OWN_TIMEOUT = {"LaunchOptions", "run_model_check"}


def _number(node: ast.expr) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _is_timeout_mark(call: ast.Call) -> bool:
    """``pytest.mark.timeout(N)`` (or ``mark.timeout(N)``)."""
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == "timeout"
            and isinstance(func.value, ast.Attribute) and func.value.attr == "mark")


def _tight(path: Path, root: Path = TESTS.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        where = f"{path.relative_to(root)}:{node.lineno}"
        if _is_timeout_mark(node) and node.args:
            value = _number(node.args[0])
            if value is not None and value < MIN_TEST_S:
                found.append(f"{where}: pytest.mark.timeout({value:g}) < {MIN_TEST_S}")
            continue
        if _callee(node) in LAUNCH_OWN_TIMEOUT:
            continue
        for keyword in node.keywords:
            value = _number(keyword.value) if keyword.arg == "timeout" else None
            if value is not None and value < MIN_WAIT_S:
                found.append(f"{where}: {_callee(node)}(timeout={value:g}) < {MIN_WAIT_S}")
    return found


def test_every_wait_and_test_timeout_in_the_suite_is_generous() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 100  # the scan sees the suite, not an empty folder
    tight = [line for path in files for line in _tight(path)]
    assert tight == [], "\n".join(tight)


def test_the_scan_flags_a_tight_wait_and_a_tight_mark(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text("import pytest, subprocess\n"
                      "@pytest.mark.timeout(120)\n"
                      "def test_x():\n"
                      "    subprocess.run(['true'], timeout=30)\n"
                      "    LaunchOptions(timeout=5)\n"
                      "    subprocess.run(['true'], timeout=300)\n")
    tight = _tight(sample, tmp_path)
    assert [line.split(": ", 1)[1] for line in tight] == [
        "pytest.mark.timeout(120) < 400", "run(timeout=30) < 300"]
