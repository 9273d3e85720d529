"""hpcodegen's plugin groups of Python entry points, read once per process and import path.

Reading a group scans the metadata of every installed distribution (~2 ms on a small venv,
more under a long ``sys.path``). The injection-target registry (:mod:`hpcodegen.targets`)
and the special-handler registry (:mod:`hpcodegen.runtime.handlers`) are consulted on every
artifact check, load and install: thousands of times in one long-lived process (a kept gloo
rank of the tests, a test worker, ``bench/coverage.py``), ~1,800 reads in the ranks of one
run of the multi-rank tests. The answer is kept per ``sys.path``: a distribution installed
while a process runs is seen by the next process, or by this one once its import path
changes. Reading imports nothing a plugin ships (``EntryPoint.load`` does, when a caller
resolves one).
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any


def entry_point_group(group: str) -> tuple[Any, ...]:
    """The ``importlib.metadata.EntryPoint`` objects registered under ``group``."""
    return _read(group, tuple(sys.path))


@lru_cache(maxsize=16)
def _read(group: str, path: tuple[str, ...]) -> tuple[Any, ...]:
    from importlib.metadata import entry_points  # ~12 ms to import: only when a group is read

    return tuple(entry_points(group=group))
