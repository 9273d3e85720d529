"""Plugins registered as entry points: an installed distribution's injection targets and
special handlers are found, each group is read once per import path, and a changed path is
read again (:mod:`hpcodegen.entry_points`)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from hpcodegen import entry_points, targets


def _plugin(site: Path) -> Path:
    """A distribution ``acme-plugin`` in ``site`` registering one target and one handler."""
    info = site / "acme_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[hpcodegen.injection_targets]\nacme_attn = acme_plugin.ops:attn\n\n"
        "[hpcodegen.special_handlers]\nacme_sync = acme_plugin.ops:sync\n")
    (site / "acme_plugin").mkdir()
    (site / "acme_plugin" / "__init__.py").write_text("")
    (site / "acme_plugin" / "ops.py").write_text(
        "def attn(module, **kw):\n    return module\n\n"
        "def sync(module, name, active):\n    return None\n")
    return site


def test_an_installed_plugin_is_found_and_gone_with_its_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "acme_attn" not in targets.registry()
    with monkeypatch.context() as m:
        m.syspath_prepend(str(_plugin(tmp_path / "site")))
        known = targets.registry()
        assert known["acme_attn"] == known["acme_plugin.ops.attn"] == "acme_plugin.ops:attn"
        assert targets.target_spec("acme_attn") == "acme_plugin.ops:attn"
    assert "acme_attn" not in targets.registry()  # the path changed back: read again


def test_a_plugin_handler_is_loaded_beside_the_builtins(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcodegen.runtime.handlers import BUILTIN_HANDLERS, handler_registry

    monkeypatch.syspath_prepend(str(_plugin(tmp_path / "site")))
    registry = handler_registry()
    assert registry["acme_sync"].__module__ == "acme_plugin.ops"
    assert set(BUILTIN_HANDLERS) < set(registry)


def test_a_group_is_read_once_per_import_path(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    real = importlib.metadata.entry_points

    def counted(**kw):
        reads.append(kw["group"])
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted)
    entry_points._read.cache_clear()
    for _ in range(5):
        targets.registry()
    assert reads == [targets.ENTRY_POINT_GROUP]
    monkeypatch.syspath_prepend("/nonexistent-hpcodegen-test-dir")
    targets.registry()
    assert reads == [targets.ENTRY_POINT_GROUP] * 2
    entry_points._read.cache_clear()  # no counted reads kept for later tests
