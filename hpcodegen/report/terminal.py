"""Plain text for terminals and logs: the width (``COLUMNS``, else the terminal, else 80),
folded lines, and a reader that closed the pipe.

rich consoles get the same width on their own (they read ``COLUMNS``); lines printed without
rich go through :func:`fold_text` so no line is wider than the terminal or, piped, 80 columns.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from typing import Any, TextIO


def width() -> int:
    """``COLUMNS`` when set, else the terminal's width, else 80 (a pipe or a file)."""
    return max(shutil.get_terminal_size(fallback=(80, 24)).columns, 20)


def fold_text(text: str, indent: str = "  ", columns: int | None = None) -> str:
    """``text`` wrapped at word boundaries to ``columns``; continuation lines indented, words
    longer than a line (paths) broken. Embedded newlines are kept."""
    cols = columns or width()
    out = []
    for line in text.splitlines() or [""]:
        out.extend(textwrap.wrap(line, cols, subsequent_indent=indent, break_long_words=True,
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

    return _Console(**kwargs)


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
