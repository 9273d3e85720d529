"""Which HF config sizes must divide the tp size (pure; the one rule generate and verify apply).

Heads and kv heads are split over tp whole: a count that does not divide is an error
(attention cannot run). A sharded dim that does not divide (the MLP width, the vocab) is a
warning: torch shards it unevenly, which runs but is not what the HF plan intends.
``generate`` refuses every finding (it only emits even shards); verify's ``model`` check
reports them with these severities. Multimodal configs keep the sizes in ``text_config``,
read when the top level lacks them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from hpcodegen.errors import Finding, Severity, error, warning

#: config field -> why it must divide tp; a miss is an error
HEAD_FIELDS: tuple[tuple[str, str], ...] = (
    ("num_attention_heads", "attention heads are split over tp"),
    ("num_key_value_heads", "key/value heads are split over tp"),
)
#: config field -> why it should divide tp; a miss is a warning (torch shards unevenly)
SHARDED_FIELDS: tuple[tuple[str, str], ...] = (
    ("intermediate_size", "the MLP is split over tp"),
    ("vocab_size", "the embedding and lm_head are split on the vocab over tp"),
)


#: other spellings of a size in config.json (GPT-2 ``n_head``, MPT ``n_heads``), read when
#: the field itself is absent. Not ``num_heads``: Mamba-2 names its SSM heads so.
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "num_attention_heads": ("n_head", "n_heads"),
}


def config_size(config: Mapping[str, Any], key: str) -> tuple[str, int] | None:
    """``(JSON pointer, value)`` of an integer size, top level first, then ``text_config``;
    the field itself first, then its other spellings (``FIELD_ALIASES``)."""
    text = config.get("text_config")
    for where, scope in (("", config), ("/text_config", text)):
        for name in (key, *FIELD_ALIASES.get(key, ())):
            value = scope.get(name) if isinstance(scope, Mapping) else None
            if isinstance(value, int) and not isinstance(value, bool):
                return f"{where}/{name}", value
    return None


def tp_divisibility(config: Mapping[str, Any], tp: int, check: str,
                    where: str | None = None, unsplit: Collection[str] = ()) -> list[Finding]:
    """Findings for the sizes of ``config`` that do not divide ``tp``.

    Args:
        config: the HF config (plain JSON).
        tp: the tp size.
        check: the code prefix (``generate``, ``model``).
        where: the pointer every finding names; the config field's pointer when None.
        unsplit: fields the plan does not split over tp (the package rules'
            ``unsplit_fields``: a multi-query model's one k/v head, kept whole).
    """
    found: list[Finding] = []
    fields = [(k, why, Severity.ERROR) for k, why in HEAD_FIELDS]
    fields += [(k, why, Severity.WARNING) for k, why in SHARDED_FIELDS]
    for key, why, severity in fields:
        if key in unsplit:
            continue
        size = config_size(config, key)
        if size is None or tp < 1 or size[1] % tp == 0:
            continue
        pointer, value = size
        name = pointer[1:].replace("/", ".")
        message = f"{name} = {value} is not divisible by tp_size = {tp} ({why})"
        if severity is Severity.ERROR:
            found.append(error(f"{check}.heads_not_divisible", where or pointer, message,
                               expected=f"a multiple of {tp}",
                               hint="choose a tp size that divides the head counts"))
        else:
            found.append(warning(f"{check}.uneven_dim", where or pointer, message,
                                 expected=f"a multiple of {tp}"))
    return found
