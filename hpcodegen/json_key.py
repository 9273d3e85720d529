"""One parsed JSON value's identity as a dict key, so repeated values are judged once.

A 10,000-entry plan repeats a handful of distinct entries (every layer is the layer
before, FQNs aside); the schema check and the plan codec each handle a value once per
distinct content. ``marshal`` is a lossless serialisation of JSON's types (``1``, ``1.0``,
``True`` and ``"1"`` stay apart, key order is kept), so equal keys mean equal values; it
runs three times as fast as ``repr``. Equal values that marshal differently only miss.
"""

from __future__ import annotations

import marshal
from typing import Any


def json_key(value: Any) -> str | bytes | None:
    """``value`` itself for a string (the common case, and never equal to a bytes key), its
    marshalled bytes for anything else; None when it cannot be marshalled (nested too
    deeply, or not a JSON value): the caller then handles it on its own."""
    if type(value) is str:
        return value
    try:
        return marshal.dumps(value)
    except (ValueError, RecursionError):
        return None
