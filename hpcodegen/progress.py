"""Progress for the slow steps (generate's model build, verify's model check): a rich
spinner with the step's name and elapsed time on a terminal's stderr, nothing otherwise.

Library calls stay silent unless the CLI switched progress on (:func:`enable`), which it does
only when stderr is a terminal and neither ``--json`` nor ``--quiet`` was given. So piped
output, logs and tests never see it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_console: Any = None


def enable(stream: Any = None) -> bool:
    """Show progress on ``stream`` (stderr) when it is a terminal; returns whether it will."""
    global _console
    stream = stream or sys.stderr
    if not stream.isatty():
        _console = None
        return False
    from rich.console import Console

    _console = Console(file=stream, highlight=False)
    return _console.is_terminal


def disable() -> None:
    global _console
    _console = None


@contextmanager
def steps(title: str, total: int) -> Iterator[Callable[[str], None]]:
    """Yields ``advance(description)``: the previous step is done, ``description`` runs now.

    Example::

        with steps("generate", 3) as advance:
            advance("building the model on the meta device")
            ...
    """
    if _console is None:
        yield lambda _description: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (SpinnerColumn(), TextColumn(f"{title}: {{task.description}}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_console, transient=True) as progress:
        task = progress.add_task("starting", total=total)
        started = [False]

        def advance(description: str) -> None:
            # drawn now, not at the next 10 Hz refresh: a step shorter than 0.1 s is shown too
            progress.update(task, description=description, advance=1 if started[0] else 0,
                            refresh=True)
            started[0] = True

        yield advance
