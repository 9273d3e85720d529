"""The run's order (tests/conftest.py): modules with the longest explicit ``timeout`` mark
first, each module whole, so the work-stealing workers of ``make test`` end on short tests.

Checked on this session's own collection (the whole suite under ``make test``)."""

from __future__ import annotations

import pytest


def _mark(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker is not None and marker.args else 0.0


def test_modules_run_whole_and_the_longest_timeout_marks_first(request) -> None:
    items = request.session.items
    runs: list[str] = []
    weight: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        if not runs or runs[-1] != module:
            runs.append(module)
        weight[module] = max(weight.get(module, 0.0), _mark(item))
    assert len(runs) == len(set(runs)), "a module's tests are split in the order"
    order = [weight[m] for m in runs]
    assert order == sorted(order, reverse=True), list(zip(runs, order, strict=True))
