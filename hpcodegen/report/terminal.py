"""Plain text for terminals and logs: the width (``COLUMNS``, else the terminal, else 80),
folded lines, and a reader that closed the pipe.

The folding rule, for every verb's text: lines break at spaces, never inside a token, so a
path, a JSON pointer or a module FQN stays whole and greppable in a CI log; a token longer
than the room left overflows the line instead. Lines printed without rich go through
:func:`fold_text`; the rich consoles of :func:`console` (same width: they read ``COLUMNS``)
fold text the same way, and size a table's columns so no cell breaks a word (the table is
wider than the width only when its words cannot fit).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from typing import Any, TextIO


def width() -> int:
    """``COLUMNS`` when set, else the terminal's width, else 80 (a pipe or a file)."""
    return max(shutil.get_terminal_size(fallback=(80, 24)).columns, 20)


def fold_text(text: str, indent: str = "  ", columns: int | None = None) -> str:
    """``text`` wrapped at spaces to ``columns``; continuation lines indented by ``indent``
    more than the line; a word longer than a line (a path) stays whole on a line of its
    own. Embedded newlines are kept."""
    cols = columns or width()
    out = []
    for line in text.splitlines() or [""]:
        hang = line[:len(line) - len(line.lstrip(" "))] + indent
        out.extend(textwrap.wrap(line, cols, subsequent_indent=hang, break_long_words=False,
                                 break_on_hyphens=False, drop_whitespace=True) or [""])
    return "\n".join(out)


def print_folded(text: str, stream: TextIO | None = None) -> None:
    """Print ``text`` folded to the width."""
    stream = stream or sys.stderr
    stream.write(fold_text(text) + "\n")


def fold_command(tokens: list[str], columns: int | None = None) -> str:
    """A shell command (already quoted tokens) folded with `` \\`` continuations, so it stays
    copy-pasteable; continuation lines indented 4. A token longer than a line stays whole."""
    cols = columns or width()
    lines: list[str] = []
    line = ""
    for token in tokens:
        indent = "    " if lines else ""
        candidate = f"{line} {token}" if line else indent + token
        if line and len(candidate) + 2 > cols:
            lines.append(line + " \\")
            line = "    " + token
        else:
            line = candidate
    lines.append(line)
    return "\n".join(lines)


def human_bytes(n: float | None, precision: int = 2) -> str:
    """Binary units (``512 B``, ``1.50 KiB``, ``2.00 GiB``); ``?`` for unknown."""
    if n is None:
        return "?"
    from rich.filesize import pick_unit_and_suffix

    unit, suffix = pick_unit_and_suffix(int(abs(n)), ["B", "KiB", "MiB", "GiB", "TiB"],
                                        1024)
    return f"{n:.0f} B" if unit == 1 else f"{n / unit:.{precision}f} {suffix}"


def console(**kwargs: Any) -> Any:
    """A rich Console (width: COLUMNS, the terminal's, or 80) whose closed pipe raises
    ``BrokenPipeError`` for the verb to end on with its own exit code; rich's default is
    ``SystemExit(1)``, which reads as "a check failed"."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            reader_gone()
            raise BrokenPipeError

        def print(self, *objects: Any, **kwargs: Any) -> None:
            """rich's print, folding as the module says: text at spaces only (rich's own
            wrap folds or crops a long word), a table no narrower than its longest words."""
            if len(objects) != 1 or kwargs.get("no_wrap") or kwargs.get("soft_wrap"):
                super().print(*objects, **kwargs)
                return
            whole_words(self, objects[0], super().print, kwargs)

    return _Console(**kwargs)


def whole_words(console: Any, renderable: Any, emit: Any, kwargs: dict[str, Any]) -> None:
    """Print ``renderable`` through ``emit`` (rich's print) without breaking a token."""
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    if isinstance(renderable, str):
        renderable = console.render_str(renderable, markup=kwargs.pop("markup", None),
                                        highlight=kwargs.pop("highlight", None),
                                        emoji=kwargs.pop("emoji", None))
    if isinstance(renderable, Text):
        whole = {**kwargs, "no_wrap": True, "overflow": "ignore", "crop": False}
        for line in renderable.split(allow_blank=True):
            hang = line.plain[:len(line.plain) - len(line.plain.lstrip(" "))] + "  "
            room = console.width
            while True:  # as fold_text: break at spaces, continuation lines indented
                breaks = space_breaks(line.plain, room)
                if not breaks:
                    break
                head, line = line.divide(breaks[:1])
                head.rstrip()
                emit(head, **whole)
                line = Text(hang, end="") + line
                room = max(console.width, len(hang) + 1)
            line.rstrip()
            emit(line, **whole)
        return
    if not isinstance(renderable, Table) or not renderable.columns:
        emit(renderable, **kwargs)
        return
    widths = column_widths(console, renderable, console.width)
    kept = [(c.width, c.min_width) for c in renderable.columns]
    kept_width = console.width
    for column, size in zip(renderable.columns, widths, strict=True):
        column.width = column.min_width = size  # rich would squeeze a column below a word
    _, right, _, left = Padding.unpack(renderable.padding)
    total = sum(widths) + (left + right) * len(widths) + len(widths) + 1  # borders at most
    console.width = max(console.width, total)
    try:
        emit(renderable, **{**kwargs, "crop": False})
    finally:
        console.width = kept_width
        for column, (width, min_width) in zip(renderable.columns, kept, strict=True):
            column.width, column.min_width = width, min_width


def space_breaks(text: str, columns: int) -> list[int]:
    """Offsets at which to break ``text`` so each line fits ``columns`` cells, at spaces only:
    a word longer than the room left starts a line of its own and overflows it."""
    from rich.cells import cell_len

    breaks: list[int] = []
    used = cell_len(text[:len(text) - len(text.lstrip(" "))])
    on_line = False
    for match in re.finditer(r"\S+\s*", text):
        word = match.group()
        if on_line and used + cell_len(word.rstrip()) > columns:
            breaks.append(match.start())
            used = 0
        used += cell_len(word)
        on_line = True
    return breaks


def column_widths(console: Any, table: Any, columns: int) -> list[int]:
    """Content widths for ``table``'s columns that never break a word: each starts at its
    unwrapped width and the widest shrinks first, never below its longest word (header
    included) or its ``min_width``; the table is wider than ``columns`` only when its
    words cannot fit."""
    from rich.measure import Measurement
    from rich.padding import Padding

    wide = console.options.update_width(1 << 16)
    _, right, _, left = Padding.unpack(table.padding)
    border = len(table.columns) - 1 + (2 if table.show_edge else 0) if table.box else 0
    least, widths = [], []
    for column in table.columns:
        cells = [column.header, *column.cells] if table.show_header else list(column.cells)
        sizes = [Measurement.get(console, wide, c) for c in cells]
        least.append(max([column.min_width or 0, *(m.minimum for m in sizes)]))
        widths.append(max([least[-1], *(m.maximum for m in sizes)]))
    excess = sum(widths) + border + (left + right) * len(widths) - columns
    while excess > 0:
        shrinkable = [i for i, w in enumerate(widths) if w > least[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return widths


def reader_gone() -> None:
    """stdout's reader closed the pipe (``| head``): send what is left to /dev/null, so the
    flush at exit neither fails nor prints ``BrokenPipeError``."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)
