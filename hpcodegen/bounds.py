"""One rule for the numbers a command line may ask for (pure: no torch).

A size, a count or a length outside what can exist (a negative shard size, a sequence of
10^30 tokens, a tensor-parallel degree above any machine's rank count, a NaN timeout) is a
usage error, exit 2, refused before anything is read or started; every verb's numeric
option goes through :func:`int_problem` or :func:`float_problem` with the limits below, so
one request is refused the same way wherever it is made.
"""

from __future__ import annotations

import math

from hpcodegen.errors import Finding, error

#: Most ranks of one mesh axis or job (``--tp``, ``--ep``, ``--cp``, ``--nproc``, ``--mesh``).
MAX_RANKS = 1 << 20
#: Most nodes of one job (``--nnodes``).
MAX_NODES = 1 << 16
#: Longest sequence and largest batch (``inspect-plan --seq/--batch``) and most tokens
#: of one batch: a traced activation must stay far inside int64 element counts.
MAX_SEQ = 1 << 31
MAX_BATCH = 1 << 31
MAX_TOKENS = 1 << 40
#: Most optimizer steps of the smoke job (``launch --steps``).
MAX_STEPS = 10**9
#: Seeds torch accepts (``torch.manual_seed``: a 64-bit value).
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
#: Longest ``launch --timeout`` (a year).
MAX_TIMEOUT_S = 365 * 24 * 3600.0
#: Largest ``export --max-shard-bytes`` (1 PiB).
MAX_SHARD_BYTES = 1 << 50


def int_problem(code: str, flag: str, value: int | None, low: int, high: int
                ) -> list[Finding]:
    """``[]`` when ``value`` (None: not given) is an integer in ``low .. high``, else the
    finding saying so."""
    if value is None or (type(value) is int and low <= value <= high):
        return []
    shown = _show(value)
    side = f"must be >= {low}" if type(value) is int and value < low else f"must be <= {high}"
    return [error(code, flag, f"{flag} {shown}: out of range ({flag} {side})",
                  expected=f"an integer in {low} .. {high}")]


def float_problem(code: str, flag: str, value: float | None, low: float, high: float, *,
                  low_open: bool = False) -> list[Finding]:
    """``[]`` when ``value`` (None: not given) is a finite number in ``low .. high``
    (``low_open``: above ``low``), else the finding saying so (NaN and infinities too)."""
    if value is None:
        return []
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (value > low if low_open else value >= low)
          and value <= high)
    if ok:
        return []
    bound = f"> {low:g}" if low_open else f">= {low:g}"
    return [error(code, flag, f"{flag} {_show(value)}: out of range ({flag} must be finite, "
                  f"{bound} and <= {high:g})", expected=f"a finite number {bound} and "
                                                     f"<= {high:g}")]


def _show(value: object) -> str:
    """The value as given, shortened (a 5,000-digit integer stays one short line)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        digits = int(abs(value).bit_length() * math.log10(2)) + 1  # str() may refuse it
        return f"{'-' if value < 0 else ''}(a {digits}-digit integer)"
    return str(value)[:60]
