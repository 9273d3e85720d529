"""Which HF config sizes must divide the tp size (pure; the one rule generate and verify apply).

Heads and kv heads are split over tp whole: a count that does not divide is an error
(attention cannot run). A sharded dim that does not divide (the MLP width, the vocab) is a
warning: torch shards it unevenly, which runs but is not what the HF plan intends.
``generate`` refuses every finding (it only emits even shards); verify's ``model`` check
reports them with these severities. Multimodal configs keep the sizes in ``text_config``,
read when the top level lacks them.

Two rules see past the top level, both pure (no model is built), so that verify's ``model``
check, inspect-plan and generate refuse alike what the runtime would divide:

- :func:`divided_config_findings`: a sub-config (BLT's ``global_config``, a composite's
  ``vision_config``) configures the stack under a module named for it
  (``global_transformer``, ``vision_tower``); when the plan splits a module there over tp
  (it shards a parameter on tp or lists ``tp_divide_attrs``), its head counts must divide
  tp. A ``tp_divide_attrs`` path through a held config (xLSTM's
  ``mlstm_layer.config.num_heads``) names a config field that must divide.
- :func:`divide_attr_findings`: each ``tp_divide_attrs`` attribute, resolved by the caller on
  a real or meta-device model, exists and is an integer tp divides (the runtime's own check).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from hpcodegen.errors import Finding, Severity, error, warning
from hpcodegen.placement import REPLICATE, Shard
from hpcodegen.plan.entry import join_fqn
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import TP, PlanEntry

#: the typed ``param_plan``: module FQN -> entry
Entries = Mapping[str, PlanEntry]

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
                    where: str | None = None, unsplit: Collection[str] = (),
                    plan: Entries | None = None) -> list[Finding]:
    """Findings for the sizes of ``config`` that do not divide ``tp``.

    Args:
        config: the HF config (plain JSON).
        tp: the tp size.
        check: the code prefix (``generate``, ``model``).
        where: the pointer every finding names; the config field's pointer when None.
        unsplit: fields the plan does not split over tp (the package rules'
            ``unsplit_fields``, which generate applies before any plan exists; with
            ``plan`` the plan itself says which heads it splits, :func:`split_head_kinds`,
            which is all the gate uses).
        plan: the typed ``param_plan`` entries; when given, the head counts of the
            sub-configs and held configs it divides are checked too
            (:func:`divided_config_findings`).
    """
    found: list[Finding] = []
    split = (True, True) if plan is None else split_head_kinds(plan)
    fields = [(k, why, Severity.ERROR) for (k, why), on in zip(HEAD_FIELDS, split,
                                                               strict=True) if on]
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
    if plan is not None:
        found += divided_config_findings(config, plan, tp, check, where, unsplit)
    return found


#: the input projections of an attention, in transformers' names: a plan that shards one
#: in a boundary that does not gather it back splits heads over tp
ATTENTION_PROJECTIONS = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "query_key_value",
                                   "c_attn", "Wqkv", "q_b_proj", "kv_b_proj", "query", "key",
                                   "value", "qkv", "W_pack"})
#: words of a module name that mark an attention (``self_attn``, ``attention``)
ATTENTION_WORDS = ("attn", "attention")


def splits_heads(plan: Entries) -> bool:
    """Whether the plan splits attention heads (query or key/value) over tp."""
    return any(split_head_kinds(plan))


def split_head_kinds(plan: Entries) -> tuple[bool, bool]:
    """``(query heads split, key/value heads split)`` over tp, read from the plan alone.

    The plan is the one source of what is split, so the gate needs no rule file: a
    boundary that shards an attention input projection (by transformers' names) and keeps
    its output split splits the heads; a projection whose output the same boundary
    all-gathers (``colwise_gather_output``: GPTBigCode's multi-query c_attn, Phi-3-medium's
    fused q|k|v) splits none, and a plan that shards none of them splits none.

    Where no projection is recognised at all, the query heads are taken as split (the rule
    as it always was: an unknown attention, or a head count another module divides, as
    RecurrentGemma's RG-LRU does), the key/value heads only when the plan shards a
    parameter under a module named as an attention (``ATTENTION_WORDS``): a plan that
    splits recurrent or MLP blocks alone (RecurrentGemma with one shared k/v head) keeps
    them whole.
    """
    seen = False
    for fqn, entry in plan.items():
        gathers = _gathers_output(entry)
        for rel, named in (entry.params or EMPTY).items():
            parts = (f"{fqn}.{rel}" if fqn else rel).split(".")
            if not set(parts[-2:-1]) & ATTENTION_PROJECTIONS:
                continue
            seen = True
            if named.get(TP, REPLICATE) != REPLICATE and not gathers:
                return True, True
    if seen:
        return False, False
    return True, _attention_split(plan)


def _attention_split(plan: Entries) -> bool:
    """Whether the plan shards a parameter on tp under a module named as an attention."""
    for fqn, entry in plan.items():
        for rel, named in (entry.params or EMPTY).items():
            if named.get(TP, REPLICATE) == REPLICATE:
                continue
            parts = (f"{fqn}.{rel}" if fqn else rel).lower().split(".")[:-1]
            if any(w in part for part in parts for w in ATTENTION_WORDS):
                return True
    return False


def _gathers_output(entry: PlanEntry) -> bool:
    dst = entry.out_dst or EMPTY
    return any(named.get(TP) == Shard(-1) and name in dst and dst[name].get(TP) == REPLICATE
               for name, named in (entry.out_src or EMPTY).items())


#: sub-config stem -> module-name words of the stack it configures (others: the stem itself)
STEM_WORDS: dict[str, tuple[str, ...]] = {"text": ("text", "language", "lm")}
#: how deep sub-configs are searched (a composite's text_config holding its own sub-configs)
MAX_CONFIG_DEPTH = 3


def _sub_configs(config: Mapping[str, Any], at: str = "", depth: int = 0
                 ) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """``(JSON pointer, stem, mapping)`` of every nested config object (an object under a
    ``*_config`` key, or one with a ``model_type``: MusicGen's ``decoder``), the stem being
    the key without its ``_config`` suffix."""
    if depth >= MAX_CONFIG_DEPTH:
        return
    for key, value in config.items():
        if not isinstance(value, Mapping) or not isinstance(key, str):
            continue
        named = key.endswith("config") or isinstance(value.get("model_type"), str)
        stem = key[:-len("config")].rstrip("_") if key.endswith("config") else key
        if named and stem:
            yield f"{at}/{key}", stem, value
            yield from _sub_configs(value, f"{at}/{key}", depth + 1)


def _dividing_modules(plan: Entries) -> Iterator[tuple[str, list[str]]]:
    """``(module FQN, tp_divide_attrs)`` of every entry that lists some."""
    for fqn, entry in plan.items():
        if entry.tp_divide_attrs:
            yield fqn, list(entry.tp_divide_attrs)


def _split_modules(plan: Entries) -> list[str]:
    """FQNs of the entries the plan splits over tp: they list ``tp_divide_attrs`` or shard a
    parameter on tp (a stack whose projections are split splits its heads too)."""
    out = [fqn for fqn, entry in plan.items()
           if entry.tp_divide_attrs or any(named.get(TP, REPLICATE) != REPLICATE
                                           for named in (entry.params or EMPTY).values())]
    divides = {fqn for fqn, _ in _dividing_modules(plan)}
    return sorted(out, key=lambda fqn: fqn not in divides)  # named first: those dividing


def _configures(stem: str, fqn: str) -> bool:
    """Whether a module FQN lies in the stack a ``<stem>_config`` configures: one of its
    dotted names holds every ``_``-separated word of the stem (``global`` in
    ``model.global_transformer.layers.0``, ``depth_decoder`` in ``model.depth_decoder``)."""
    stems = STEM_WORDS.get(stem, (stem,))
    return any(set(s.split("_")) <= set(part.split("_"))
               for part in fqn.split(".") for s in stems)


def _head_sizes(scope: Mapping[str, Any]) -> Iterator[tuple[str, int, str]]:
    """``(field, value, why)`` of each head count set in one config object."""
    for key, why in HEAD_FIELDS:
        for name in (key, *FIELD_ALIASES.get(key, ())):
            value = scope.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                yield name, value, why
                break


def divided_config_findings(config: Mapping[str, Any], plan: Entries, tp: int,
                            check: str, where: str | None = None,
                            unsplit: Collection[str] = ()) -> list[Finding]:
    """Errors for head counts of sub-configs and held configs that the plan divides by tp.

    A sub-config's heads are checked when some module the plan splits over tp lies in its
    stack (:func:`_split_modules`, :func:`_configures`); a ``tp_divide_attrs`` path
    ``...config.F`` divides field ``F`` of the model's config (top level, else
    ``text_config``). The top level and a lone
    ``text_config`` are :func:`tp_divisibility`'s own.
    """
    if tp <= 1:
        return []
    dividing = list(_dividing_modules(plan))
    subs = list(_sub_configs(config))
    split = _split_modules(plan) if subs else []
    found: list[Finding] = []
    sizes = [config_size(config, key) for key, _ in HEAD_FIELDS]
    text_read = any(s is not None and s[0].startswith("/text_config/") for s in sizes)
    top_fields = {n for key, _ in HEAD_FIELDS for n in (key, *FIELD_ALIASES.get(key, ()))}
    for pointer, stem, scope in subs:
        if text_read and pointer == "/text_config":
            continue  # read by tp_divisibility already
        users = [fqn for fqn in split if _configures(stem, fqn)]
        if not users:
            continue
        for name, value, why in _head_sizes(scope):
            if name not in unsplit and value % tp:
                found.append(_head_error(check, where, f"{pointer}/{name}", value, tp, why,
                                         users))
    held: dict[tuple[str, int], list[str]] = {}
    for fqn, attrs in dividing:
        for attr in attrs:
            parts = attr.split(".")
            if len(parts) < 2 or parts[-2] != "config" or parts[-1] in unsplit \
                    or parts[-1] in top_fields:  # those tp_divisibility reads itself
                continue
            size = config_size(config, parts[-1])
            if size is not None and size[1] % tp:
                held.setdefault(size, []).append(fqn)
    for (field, value), users in held.items():
        found.append(_head_error(check, where, field, value, tp,
                                 "a module's held config is divided", users))
    return found


def _head_error(check: str, where: str | None, field: str, value: int, tp: int, why: str,
                users: list[str]) -> Finding:
    name = field[1:].replace("/", ".")
    more = f" and {len(users) - 1} more" if len(users) > 1 else ""
    return error(f"{check}.heads_not_divisible", where or field,
                 f"{name} = {value} is not divisible by tp_size = {tp} ({why}; it sizes "
                 f"{users[0]}{more}, which the plan splits over tp)",
                 expected=f"a multiple of {tp}",
                 hint="choose a tp size that divides the head counts")


#: what a resolver returns for an attribute that does not exist
MISSING = object()


def divide_attr_findings(plan: Entries, tp: int,
                         resolve: Callable[[str, str], Any], check: str,
                         locate: Callable[[str, int, str], str] | None = None
                         ) -> list[Finding]:
    """The runtime's rule for ``tp_divide_attrs``, on attribute values a caller resolves.

    Each attribute must exist and be an integer that tp divides (each rank keeps value/tp).

    Args:
        plan: the typed ``param_plan`` entries.
        tp: the tp size.
        resolve: ``(module FQN, attribute path) -> value``; :data:`MISSING` when absent,
            None when the caller cannot check it (a replaced module): skipped.
        check: the code prefix (``generate``, ``model``, ``runtime``).
        locate: ``(module FQN, index, attribute path) -> where`` a finding points;
            default the attribute's full dotted name.
    """
    found: list[Finding] = []
    for fqn, attrs in _dividing_modules(plan):
        for i, attr in enumerate(attrs):
            value = resolve(fqn, attr)
            if value is None:
                continue
            full = join_fqn(fqn, attr)
            where = locate(fqn, i, attr) if locate is not None else full
            if value is MISSING:
                found.append(error(f"{check}.missing_attr", where, f"tp_divide_attrs names a "
                                   f"missing attribute: {full} does not exist, so the "
                                   "runtime cannot divide it by tp",
                                   expected="an integer attribute of the module"))
            elif not isinstance(value, int) or isinstance(value, bool) or value % tp:
                what = "is not divisible" if isinstance(value, int) and not isinstance(
                    value, bool) else "is not an integer divisible"
                found.append(error(f"{check}.indivisible_attr", where,
                                   f"{full} = {value!r} {what} by tp_size = {tp} (each rank "
                                   f"runs {attr.rsplit('.', 1)[-1]}/tp of them)",
                                   expected=f"a multiple of {tp}",
                                   hint="choose a tp size that divides it"))
    return found
