"""How long a synthetic batch may be, whatever the config says (pure: no torch).

The smoke job of ``launch`` and the parity probes feed random token batches. Their length
once grew with the config's sliding window (doubled until it held 8 windows, so that the
window mattered inside every cp chunk): with Mistral's default window of 4096 that was
65,536 tokens, and a 2-layer, 64-wide model's ranks grew past 8 GiB. Every length is now
bounded by :data:`MAX_SMOKE_TOKENS` and by the config's largest position; the window is
exercised (the sequence made longer than the window, up to 8 windows) only where that
fits under the bound, and :class:`SmokeLength` says when it was not, and why.

One rule for every caller: the launch rank's batch and its memory preflight
(:mod:`hpcodegen.launch.rank.model`, :mod:`hpcodegen.launch.rank.preflight`) and the
coverage probes (:mod:`hpcodegen.families.parity`, :mod:`hpcodegen.families.cp`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcodegen.hf import config_int

#: the longest sequence a synthetic batch ever has (tokens per row): long enough to
#: exercise a window of up to 63 tokens in every cp chunk and one of up to 511 at all
MAX_SMOKE_TOKENS = 512
#: how many windows the sequence should hold (cp 4 head-tail cuts it into 8 chunks)
WINDOWS_PER_SEQUENCE = 8
#: config fields that bound the positions a model embeds, in the order they are read
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
                   "seq_length")


@dataclass(frozen=True)
class SmokeLength:
    """A bounded sequence length and what it means for the config's sliding window.

    Attributes:
        length: tokens per row.
        window: the config's sliding window (None without one).
        cap: the bound applied (:data:`MAX_SMOKE_TOKENS`, or the config's max positions).
    """

    length: int
    window: int | None
    cap: int

    @property
    def window_exercised(self) -> bool:
        """Whether the sequence is longer than the window, so its mask changes the result."""
        return self.window is not None and self.length > self.window

    @property
    def note(self) -> str | None:
        """Why the window is not exercised (None when it is, or there is none)."""
        if self.window is None or self.window_exercised:
            return None
        return (f"sliding window {self.window} not exercised: the smoke sequence "
                f"({self.length} tokens) is bounded by {self.cap} tokens, so no position "
                "is farther than the window from another")

    def to_json(self) -> dict[str, Any]:
        return {"length": self.length, "window": self.window, "cap": self.cap,
                "window_exercised": self.window_exercised, "note": self.note}


def sliding_window_of(config: Any) -> int | None:
    """The config's sliding window (its text part's for a composite), None without one;
    ``config`` is a transformers config or its JSON dict."""
    return config_int(config, "sliding_window")


def max_positions_of(config: Any) -> int | None:
    """The most positions the model embeds (``max_position_embeddings`` or a spelling of
    it), None when the config names none."""
    return config_int(config, *POSITION_FIELDS)


def bounded_length(base: int, *, multiple: int = 1, window: int | None = None,
                   max_positions: int | None = None) -> SmokeLength:
    """``base`` tokens (lengthened for a short window, bounded), a multiple of ``multiple``.

    Args:
        base: the caller's usual length.
        multiple: the length must divide evenly (the world size: sequence and context
            parallelism split it).
        window: the config's sliding window: when the bound leaves room for a longer
            sequence than the window, the length is doubled while it holds fewer than
            :data:`WINDOWS_PER_SEQUENCE` windows and stays within the bound.
        max_positions: the config's largest position; the bound is the smaller of it and
            :data:`MAX_SMOKE_TOKENS`.
    """
    multiple = max(1, multiple)
    cap = MAX_SMOKE_TOKENS if max_positions is None else min(MAX_SMOKE_TOKENS, max_positions)
    top = max(multiple, cap // multiple * multiple)
    length = min(max(base, 1), top)
    # lengthen only where the bound leaves room to pass the window: a longer batch that
    # still fits inside the window would cost time and memory and exercise nothing
    while (window is not None and window < top and length <= WINDOWS_PER_SEQUENCE * window
           and length * 2 <= top):
        length *= 2
    return SmokeLength(length, window, cap)


def smoke_length_for(config: Any, base: int, multiple: int = 1, *,
                     exercise_window: bool = True) -> SmokeLength:
    """:func:`bounded_length` with the window and max positions read from ``config``."""
    return bounded_length(base, multiple=multiple,
                          window=sliding_window_of(config) if exercise_window else None,
                          max_positions=max_positions_of(config))
