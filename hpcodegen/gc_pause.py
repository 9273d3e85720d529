"""Pause Python's cyclic garbage collector over a burst of acyclic allocations (pure).

Parsing a 10,000-entry meta and checking it allocates a few hundred thousand dicts, tuples
and frozen maps, none of them in a reference cycle (JSON is a tree; the checks build
trees and tables). Each time the allocations pass the collector's threshold it scans every
young object, and every few passes the whole heap: about a sixth of ``verify``'s time on
such a meta went to collections that found nothing. :func:`paused_gc` turns the collector
off for such a span and restores its previous state after (reference counting still frees
everything as usual; only cycles wait for the next collection).

Importing torch, DTensor and transformers' model base is such a burst too: hundreds of
thousands of functions, classes and dicts that live as long as the process, none of them
garbage, scanned by the collections their own allocation triggers, and then again by every
full collection for the rest of the process. :func:`import_paused` imports them with the
collector paused and, in a process of hpcodegen's own (:func:`own_process`: the CLI, a
launched rank, torchrun's agent), freezes what exists then (``gc.freeze``: moved out of
every later collection's way; objects that live as long as the process anyway). A process
that imports that stack and builds and runs a small model three times took 3.2 s of CPU
instead of 4.5 (-29 %; paused without the freeze: 4.3), the mean of five fresh interpreters
each way on this 2-core box. A library caller's process (``hpcodegen.generate.api`` from a
notebook) gets the pause and no freeze: what it holds is its own.
"""

from __future__ import annotations

import gc
import importlib
import sys
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


#: what building and running a transformers model under hpcodegen imports: torch, DTensor and
#: transformers' model base (every model class imports it); most of a rank's start-up
MODEL_STACK: tuple[str, ...] = ("torch", "torch.distributed", "torch.distributed.tensor",
                                "transformers", "transformers.modeling_utils")


#: set by :func:`own_process`: hpcodegen's own entry points
_OWN_PROCESS = False


def own_process() -> None:
    """Mark this process as one of hpcodegen's own (the CLI's ``main``, a launched rank,
    torchrun's agent): :func:`import_paused` then also freezes what the import made."""
    global _OWN_PROCESS
    _OWN_PROCESS = True


def import_paused(*names: str) -> None:
    """Import the modules ``names`` (dotted names) with the collector paused; in a process
    of hpcodegen's own, then freeze everything alive (see the module docstring). Modules
    already imported cost a dict lookup and freeze nothing."""
    fresh = any(name not in sys.modules for name in names)
    with paused_gc():
        for name in names:
            importlib.import_module(name)
    if fresh and _OWN_PROCESS:
        gc.freeze()
