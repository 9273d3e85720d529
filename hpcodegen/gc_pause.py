"""Pause Python's cyclic garbage collector over a burst of acyclic allocations (pure).

Parsing a 10,000-entry meta and checking it allocates a few hundred thousand dicts, tuples
and frozen maps, none of them in a reference cycle (JSON is a tree; the checks build
trees and tables). Each time the allocations pass the collector's threshold it scans every
young object, and every few passes the whole heap: about a sixth of ``verify``'s time on
such a meta went to collections that found nothing. :func:`paused_gc` turns the collector
off for such a span and restores its previous state after (reference counting still frees
everything as usual; only cycles wait for the next collection).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection inside the block; the collector's state is restored after
    (nested use is fine: only the outermost block turns it back on)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
