"""``codegen_meta.json`` <-> :class:`~hpcodegen.plan.types.Plan`, losslessly (pure).

:func:`plan_from_meta` parses a meta dict once: placements through
:func:`hpcodegen.placement.parse_placement` (the one parser), arrays into tuples, objects
into :class:`~hpcodegen.plan.frozen.FrozenMap`. :func:`plan_to_meta` writes it back:
``plan_to_meta(plan_from_meta(meta)) == meta`` for every meta the schema accepts, and
:func:`render_meta` gives the file bytes (sorted keys, indent 2, ASCII, as both generators
write them), so ``JSON -> Plan -> JSON`` is byte-identical.

Each object's keys are read through a table ``key -> (field, parse, write)``. A key the
table does not know, or a known key whose value is ``null``, goes to the object's
``extra`` verbatim. A known key of the wrong shape is a :class:`PlanFormatError` naming
its JSON pointer (the schema check reports those first, so the loader never sees one).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from hpcodegen.errors import pointer
from hpcodegen.json_key import json_key
from hpcodegen.placement import Placement, PlacementSyntaxError, parse_placement
from hpcodegen.plan.frozen import FrozenMap, freeze_json, thaw_json
from hpcodegen.plan.pipeline import (
    LossContract,
    Pipeline,
    PipelineStage,
    StageBoundary,
    TiedAcrossStages,
)
from hpcodegen.plan.provenance import OutputDigest, Provenance, Source
from hpcodegen.plan.types import Injection, ParallelDims, Plan, PlanEntry, Target

__all__ = [
    "PlanFormatError",
    "as_plan",
    "dims_to_json",
    "entries_from_json",
    "entry_field_from_json",
    "entry_field_name",
    "entry_from_json",
    "injection_from_json",
    "plan_from_meta",
    "plan_to_meta",
    "readable_plan",
    "render_meta",
]


class PlanFormatError(ValueError):
    """A known meta key holds a value of the wrong shape; ``where`` is its JSON pointer."""

    def __init__(self, path: JsonPath, message: str) -> None:
        self.path = tuple(path)
        self.where = pointer(*path)
        self.message = message
        super().__init__(f"{self.where or '/'}: {message}")


#: A JSON path as its keys and indices; made a pointer only for an error (a 10,000-entry
#: plan has a quarter million keys, and escaping each would cost more than parsing it).
JsonPath = tuple[Any, ...]
Parse = Callable[[Any, JsonPath], Any]
Write = Callable[[Any], Any]
#: Parsed named placements by their items: a plan repeats a handful of them thousands of
#: times, so each is parsed once and shared (they are immutable). Bounded.
_NAMED_MEMO: dict[tuple[tuple[str, Any], ...], FrozenMap[str, Placement]] = {}
_MEMO_LIMIT = 4096


def _expect(value: Any, kind: type | tuple[type, ...], where: JsonPath, what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise PlanFormatError(where, f"expected {what}, got {type(value).__name__}")
    return value


def _str(value: Any, where: JsonPath) -> str:
    return _expect(value, str, where, "a string")


def _bool(value: Any, where: JsonPath) -> bool:
    return _expect(value, bool, where, "a boolean")


def _int(value: Any, where: JsonPath) -> int:
    return _expect(value, int, where, "an integer")


def _strs(value: Any, where: JsonPath) -> tuple[str, ...]:
    _expect(value, list, where, "an array of strings")
    if all(type(v) is str for v in value):
        return tuple(value)
    return tuple(_str(v, (*where, i)) for i, v in enumerate(value))


def _object(value: Any, where: JsonPath) -> Mapping[str, Any]:
    if type(value) is dict:  # the common case, without an ABC check (10,000 entries)
        return value
    return _expect(value, Mapping, where, "an object")


def _json(value: Any, where: JsonPath) -> Any:
    return freeze_json(value)


def _json_object(value: Any, where: JsonPath) -> FrozenMap[str, Any]:
    return freeze_json(_object(value, where))


def _json_array(value: Any, where: JsonPath) -> tuple[Any, ...]:
    return freeze_json(_expect(value, list, where, "an array"))


def _str_map(value: Any, where: JsonPath) -> FrozenMap[str, str]:
    return FrozenMap.adopt({k: _str(v, (*where, k)) for k, v in _object(value, where).items()})


def _placement(value: Any, where: JsonPath) -> Placement:
    try:
        return parse_placement(value)
    except PlacementSyntaxError as exc:
        raise PlanFormatError(where, str(exc)) from None


def _named(value: Any, where: JsonPath) -> FrozenMap[str, Placement]:
    return FrozenMap.adopt({axis: _placement(text, (*where, axis))
                      for axis, text in _object(value, where).items()})


def _named_map(value: Any, where: JsonPath) -> FrozenMap[str, FrozenMap[str, Placement]]:
    out: dict[str, FrozenMap[str, Placement]] = {}
    for name, named in _object(value, where).items():
        key = tuple(named.items()) if type(named) is dict else None
        try:
            hit = _NAMED_MEMO.get(key) if key is not None else None
        except TypeError:  # an unhashable leaf: _named names it
            key = hit = None
        if hit is None:
            hit = _named(named, (*where, name))
            if len(_NAMED_MEMO) >= _MEMO_LIMIT:
                _NAMED_MEMO.clear()
            if key is not None:
                _NAMED_MEMO[key] = hit
        out[name] = hit
    return FrozenMap.adopt(out)


def _write_named_map(value: Mapping[str, Mapping[str, Placement]]) -> dict[str, Any]:
    return {name: {axis: str(p) for axis, p in named.items()} for name, named in value.items()}


def _list(value: tuple[Any, ...]) -> list[Any]:
    return list(value)


def _target(value: Any, where: JsonPath) -> Target:
    record = _object(value, where)
    path = _str(record.get("_target_"), (*where, "_target_"))
    return Target(path=path, kwargs=freeze_json({k: v for k, v in record.items()
                                                 if k != "_target_"}))


def _write_target(target: Target | str) -> Any:
    if isinstance(target, str):
        return target
    return {"_target_": target.path, **thaw_json(target.kwargs)}


def _wrapper(value: Any, where: JsonPath) -> Target | str:
    return value if isinstance(value, str) else _target(value, where)


def _match(value: Any, where: JsonPath) -> str | tuple[str, ...]:
    return value if isinstance(value, str) else _strs(value, where)


def _write_match(value: str | tuple[str, ...]) -> Any:
    return value if isinstance(value, str) else list(value)


def _ep_stack(value: Any, where: JsonPath) -> FrozenMap[str, tuple[str, ...]]:
    return FrozenMap.adopt({k: _strs(v, (*where, k)) for k, v in _object(value, where).items()})


def _ints(value: Any, where: JsonPath) -> tuple[int, ...]:
    items = _expect(value, list, where, "an array of integers")
    return tuple(_int(v, (*where, i)) for i, v in enumerate(items))


def _pairs(value: Any, where: JsonPath) -> tuple[tuple[str, str], ...]:
    pairs = []
    for i, pair in enumerate(_expect(value, list, where, "an array of pairs")):
        names = _strs(pair, (*where, i))
        if len(names) != 2:
            raise PlanFormatError((*where, i), f"expected 2 FQNs, got {len(names)}")
        pairs.append((names[0], names[1]))
    return tuple(pairs)


# key -> (dataclass field, parse, write); write None means "as frozen JSON, thawed"
Table = dict[str, tuple[str, Parse, Write | None]]

_ENTRY: Table = {
    "params": ("params", _named_map, _write_named_map),
    "in_src": ("in_src", _named_map, _write_named_map),
    "in_dst": ("in_dst", _named_map, _write_named_map),
    "out_src": ("out_src", _named_map, _write_named_map),
    "out_dst": ("out_dst", _named_map, _write_named_map),
    "out_names": ("out_names", _strs, _list),
    "tp_divide_attrs": ("tp_divide_attrs", _strs, _list),
    "is_boundary": ("is_boundary", _bool, bool),
    "region_dispatch": ("region_dispatch", _bool, bool),
    "deferred_bias_params": ("deferred_bias_params", _strs, _list),
    "tp_rank0_params": ("tp_rank0_params", _strs, _list),
    "partial_grad_params": ("partial_grad_params", _strs, _list),
    "no_grad_inputs": ("no_grad_inputs", _strs, _list),
}
_INJECTION: Table = {
    "match": ("match", _match, _write_match),
    "inner_wrapper": ("inner_wrapper", _wrapper, _write_target),
    "inner_target": ("inner_target", _str, str),
    "inner_out_src": ("inner_out_src", _json, None),
    "inner_in_src": ("inner_in_src", _named_map, _write_named_map),
    "inner_in_dst": ("inner_in_dst", _named_map, _write_named_map),
    "inner_out_dst": ("inner_out_dst", _json, None),
    "cp_heads": ("cp_heads", _json, None),
    "local_compute_fn": ("local_compute_fn", _target, _write_target),
    "ep_stack": ("ep_stack", _ep_stack, lambda v: {k: list(s) for k, s in v.items()}),
    "ep_size": ("ep_size", _int, int),
}
_SOURCE: Table = {
    "module_name": ("module_name", _str, str),
    "architecture": ("architecture", _str, str),
    "model_type": ("model_type", _str, str),
    "structure": ("structure", _json_object, None),
}
_OUTPUT: Table = {"sha256": ("sha256", _str, str), "lines": ("lines", _int, int)}


def _fields(table: Table, value: Any, where: JsonPath) -> tuple[dict[str, Any], FrozenMap]:
    """``({field: parsed} for the table's keys, the other keys as frozen JSON)``."""
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, item in _object(value, where).items():
        spec = table.get(key)
        if spec is None or item is None:
            extra[key] = freeze_json(item)
        else:
            out[spec[0]] = spec[1](item, (*where, key))
    return out, FrozenMap.adopt(extra)


def _read(table: Table, value: Any, where: JsonPath) -> dict[str, Any]:
    """The keyword arguments of a dataclass with an ``extra`` field."""
    out, extra = _fields(table, value, where)
    return {**out, "extra": extra}


def _write(table: Table, obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, (name, _parse, write) in table.items():
        value = getattr(obj, name)
        if value is not None:
            out[key] = thaw_json(value) if write is None else write(value)
    out.update(thaw_json(getattr(obj, "extra", {})))
    return out


def _build(cls: type, fields: dict[str, Any], where: JsonPath) -> Any:
    """``cls(**fields)``; a required field absent (or null) from the JSON is a
    :class:`PlanFormatError` at its key, not a ``TypeError``."""
    for f in dataclasses.fields(cls):
        if f.name not in fields and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            raise PlanFormatError((*where, f.name), f"{f.name} is required")
    return cls(**fields)


def entry_from_json(fqn: str, value: Any, where: JsonPath | None = None) -> PlanEntry:
    """One ``param_plan`` entry (``where`` defaults to ``("param_plan", fqn)``)."""
    where = ("param_plan", fqn) if where is None else where
    return PlanEntry(fqn=fqn, **_read(_ENTRY, value, where))


def entry_field_from_json(key: str, value: Any, where: JsonPath) -> Any:
    """One ``param_plan`` entry key's JSON value as its :class:`PlanEntry` field holds it
    (the draft plan validates each value it is given so); ``None`` for a key the entry
    does not model, which the entry keeps verbatim in its ``extra``."""
    spec = _ENTRY.get(key)
    return None if spec is None or value is None else spec[1](value, (*where, key))


def entry_field_name(key: str) -> str | None:
    """The :class:`PlanEntry` field of an entry's JSON key (``None``: an ``extra`` key)."""
    spec = _ENTRY.get(key)
    return None if spec is None else spec[0]


def entry_to_json(entry: PlanEntry) -> dict[str, Any]:
    """The entry as the meta writes it."""
    return _write(_ENTRY, entry)


def entries_from_json(value: Any) -> FrozenMap[str, PlanEntry]:
    """A ``param_plan`` object's typed entries (generate hands its plan to the rules so)."""
    return _entries(value, ("param_plan",))


def _entries(value: Any, where: JsonPath,
             keys: Mapping[str, str | bytes | None] | None = None) -> FrozenMap[str, PlanEntry]:
    """Each entry parsed; entries of equal content (every layer repeats the ones of the
    layer before, FQNs aside) share one parse of their fields, which are immutable.
    ``keys``: the entries' :func:`json_key` by FQN, when the caller has them already."""
    parsed: dict[str | bytes, dict[str, Any]] = {}
    out: dict[str, PlanEntry] = {}
    for fqn, e in _object(value, where).items():
        if type(e) is not dict:
            key = None
        elif keys is not None and fqn in keys:
            key = keys[fqn]
        else:
            key = json_key(e)
        fields = parsed.get(key) if key is not None else None
        if fields is None:
            fields = _read(_ENTRY, e, (*where, fqn))
            if key is not None:
                parsed[key] = fields
        out[fqn] = PlanEntry(fqn=fqn, **fields)
    return FrozenMap.adopt(out)



def injection_from_json(value: Any, where: JsonPath = ("injections",)) -> Injection:
    """One ``injections`` record (``where``: its JSON path, for the error)."""
    return _build(Injection, _read(_INJECTION, value, where), where)


def _injections(value: Any, where: JsonPath) -> tuple[Injection, ...]:
    records = _expect(value, list, where, "an array of injection records")
    return tuple(injection_from_json(r, (*where, i)) for i, r in enumerate(records))


def _dims(value: Any, where: JsonPath) -> ParallelDims:
    sizes: dict[str, int] = {}
    flags: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, item in _object(value, where).items():
        if key.endswith("_size") and isinstance(item, int) and not isinstance(item, bool):
            sizes[key[: -len("_size")]] = item
        elif key in ("sequence_parallel", "loss_parallel") and item is not None:
            flags[key] = _bool(item, (*where, key))
        elif key == "cp_layout" and item is not None:
            flags[key] = _str(item, (*where, key))
        else:
            extra[key] = freeze_json(item)
    return ParallelDims(sizes=FrozenMap(sizes), extra=FrozenMap.adopt(extra), **flags)


def dims_to_json(dims: ParallelDims) -> dict[str, Any]:
    """``parallel_dims`` as the meta writes it (the generated module's banner shows it)."""
    return _write_dims(dims)


def _write_dims(dims: ParallelDims) -> dict[str, Any]:
    out: dict[str, Any] = {f"{axis}_size": n for axis, n in dims.sizes.items()}
    for key in ("sequence_parallel", "loss_parallel", "cp_layout"):
        if getattr(dims, key) is not None:
            out[key] = getattr(dims, key)
    out.update(thaw_json(dims.extra))
    return out


_STAGE: Table = {
    "index": ("index", _int, int),
    "rank": ("rank", _int, int),
    "modules": ("modules", _strs, _list),
    "params": ("params", _int, int),
    "params_per_rank": ("params_per_rank", _int, int),
}
_BOUNDARY: Table = {
    "activation": ("activation", _str, str),
    "placements": ("placements", _named, lambda v: {a: str(p) for a, p in v.items()}),
    "side_inputs": ("side_inputs", _str_map, dict),
}
_TIED: Table = {
    "params": ("params", _strs, _list),
    "stages": ("stages", _ints, _list),
    "grad": ("grad", _str, str),
}
_LOSS: Table = {
    "reduction": ("reduction", _str, str),
    "normalizer": ("normalizer", _str, str),
    "scale_grads": ("scale_grads", _bool, bool),
}


def _records(cls: type, table: Table) -> Parse:
    def parse(value: Any, where: JsonPath) -> tuple[Any, ...]:
        items = _expect(value, list, where, "an array of objects")
        return tuple(_build(cls, _read(table, v, (*where, i)), (*where, i))
                     for i, v in enumerate(items))
    return parse


def _record(cls: type, table: Table) -> Parse:
    return lambda value, where: _build(cls, _read(table, value, where), where)


def _rank_actions(value: Any, where: JsonPath) -> FrozenMap[str, tuple[str, ...]]:
    return FrozenMap.adopt({rank: _strs(acts, (*where, rank))
                            for rank, acts in _object(value, where).items()})


_PIPELINE: Table = {
    "pp_size": ("pp_size", _int, int),
    "schedule": ("schedule", _str, str),
    "style": ("style", _str, str),
    "stages_per_rank": ("stages_per_rank", _int, int),
    "n_microbatches": ("n_microbatches", _int, int),
    "microbatch_dim": ("microbatch_dim", _int, int),
    "module_order": ("module_order", _strs, _list),
    "replicated_modules": ("replicated_modules", _strs, _list),
    "stages": ("stages", _records(PipelineStage, _STAGE),
               lambda v: [_write(_STAGE, s) for s in v]),
    "boundary": ("boundary", _record(StageBoundary, _BOUNDARY), lambda b: _write(_BOUNDARY, b)),
    "tied_across_stages": ("tied_across_stages", _records(TiedAcrossStages, _TIED),
                           lambda v: [_write(_TIED, t) for t in v]),
    "loss": ("loss", _record(LossContract, _LOSS), lambda v: _write(_LOSS, v)),
    "actions": ("actions", _rank_actions, lambda v: {r: list(a) for r, a in v.items()}),
    "actions_sha256": ("actions_sha256", _str, str),
}
def _pipeline(value: Any, where: JsonPath) -> Pipeline:
    return _build(Pipeline, _read(_PIPELINE, value, where), where)


def _write_pipeline(pipeline: Pipeline) -> dict[str, Any]:
    return _write(_PIPELINE, pipeline)


def pipeline_from_json(value: Any, where: JsonPath = ("pipeline",)) -> Pipeline:
    """The typed ``pipeline`` section (``where``: its JSON path, for the error)."""
    return _pipeline(value, where)


def pipeline_to_json(pipeline: Pipeline) -> dict[str, Any]:
    """The ``pipeline`` section as the meta writes it."""
    return _write_pipeline(pipeline)


def _outputs(value: Any, where: JsonPath) -> FrozenMap[str, OutputDigest]:
    return FrozenMap.adopt({
        role: _build(OutputDigest, _read(_OUTPUT, rec, (*where, role)), (*where, role))
        for role, rec in _object(value, where).items()})


_PLAN: Table = {
    "param_plan": ("param_plan", _entries,
                   lambda v: {fqn: entry_to_json(e) for fqn, e in v.items()}),
    "injections": ("injections", _injections, lambda v: [_write(_INJECTION, r) for r in v]),
    "parallel_dims": ("parallel_dims", _dims, _write_dims),
    "mesh_dim_names": ("mesh_dim_names", _strs, _list),
    "tied_pairs": ("tied_pairs", _pairs, lambda v: [list(p) for p in v]),
    "special_handlers": ("special_handlers", _str_map, dict),
    "boundary_classes": ("boundary_classes", _str_map, dict),
    "frozen_sharded_params": ("frozen_sharded_params", _strs, _list),
    "entrypoints": ("entrypoints", _str_map, dict),
    "module_overrides": ("module_overrides", _json_array, None),
    "pipeline": ("pipeline", _pipeline, _write_pipeline),
}
_PROVENANCE: Table = {
    "codegen_version": ("codegen_version", _str, str),
    "signature": ("signature", _str, str),
    "yaml_path": ("yaml_path", _str, str),
    "yaml_sha256": ("yaml_sha256", _str, str),
    "source": ("source", lambda v, w: Source(**_read(_SOURCE, v, w)),
               lambda s: _write(_SOURCE, s)),
    "outputs": ("outputs", _outputs, lambda v: {k: _write(_OUTPUT, d) for k, d in v.items()}),
    "generator": ("generator", _json_object, None),
    "model_name": ("model_name", _str, str),
    "model_class": ("model_class", _str, str),
    "covered": ("covered", _json_object, None),
    "not_covered": ("not_covered", _json_array, None),
    "replacements": ("replacements", _json_array, None),
    "skipped_overrides": ("skipped_overrides", _json_array, None),
    "external_state_classes": ("external_state_classes", _json_array, None),
    "remote_siblings": ("remote_siblings", _json_array, None),
}


def plan_from_meta(meta: Mapping[str, Any], *,
                   entry_keys: Mapping[str, str | bytes | None] | None = None,
                   refused: list[Any] | None = None) -> Plan:
    """Parse a meta (the JSON object of ``codegen_meta.json``) into a :class:`Plan`.

    ``entry_keys``: the ``param_plan`` entries' :func:`~hpcodegen.json_key.json_key` by FQN,
    when the caller computed them (verify's :meth:`CheckContext.entry_keys`), so the
    entries of equal content are found without keying them again. ``refused``: decode
    tolerantly instead of raising (:mod:`hpcodegen.plan.decode`): the Plan of every value
    that decodes, and one :class:`~hpcodegen.plan.decode.Refusal` per refused leaf
    appended to the list.

    Raises:
        PlanFormatError: a known key holds a value of the wrong shape (a placement outside
            the grammar, a string where an array belongs); its ``where`` is the JSON pointer.

    Example::

        meta = json.loads(Path("examples/llama_tp2/codegen_meta.json").read_text())
        plan = plan_from_meta(meta)
        plan.entries["lm_head"].params["weight"]["tp"]    # Shard(dim=0)
    """
    if refused is not None:
        try:
            return plan_from_meta(meta, entry_keys=entry_keys)
        except PlanFormatError:
            from hpcodegen.plan.decode import tolerant_plan

            return tolerant_plan(meta, refused)
    # provenance keys with a value go to Provenance; the rest (nulls too) to the Plan
    kept = {k: v for k, v in _object(meta, ()).items() if k in _PROVENANCE and v is not None}
    own = {k: v for k, v in meta.items() if k not in kept}
    provenance = Provenance(**_fields(_PROVENANCE, kept, ())[0])
    table = _PLAN
    if entry_keys is not None:  # verify's checks keyed each entry already
        field, _parse, write = _PLAN["param_plan"]
        table = {**_PLAN, "param_plan": (field, lambda v, w: _entries(v, w, entry_keys), write)}
    return Plan(provenance=provenance, **_read(table, own, ()))


def readable_plan(meta: Mapping[str, Any], *,
                  entry_keys: Mapping[str, str | bytes | None] | None = None
                  ) -> tuple[Plan, list[PlanFormatError]]:
    """The Plan of what parses in a meta the schema may reject, and what was left out.

    For readers that report a broken meta instead of refusing it (verify's semantic
    checks beside the schema check, ``inspect-plan --no-checks``): a ``param_plan`` entry
    or an ``injections`` record the codec refuses is left out alone, any other top-level
    key whole; each refusal is returned (its ``path`` says what was left out). A meta the
    schema accepts gives ``(plan_from_meta(meta), [])``.
    """
    view = dict(_object(meta, ()))
    left_out: list[PlanFormatError] = []
    while True:
        try:
            return plan_from_meta(view, entry_keys=entry_keys), left_out
        except PlanFormatError as exc:
            key, *rest = exc.path or (None,)
            part = view.get(key)
            if key == "param_plan" and rest and isinstance(part, Mapping):
                view[key] = {f: e for f, e in part.items() if f != rest[0]}
            elif key == "injections" and rest and isinstance(part, list):
                view[key] = [r for i, r in enumerate(part) if i != rest[0]]
            elif key in view:
                del view[key]
            else:  # cannot happen: every refusal lies under a top-level key
                raise
            left_out.append(exc)


def plan_to_meta(plan: Plan) -> dict[str, Any]:
    """The meta dict of ``plan``; equal to the dict it was parsed from."""
    return {**_write(_PLAN, plan), **_write(_PROVENANCE, plan.provenance)}


def as_plan(value: Plan | Mapping[str, Any]) -> Plan:
    """``value`` when it is a :class:`Plan`, else the Plan of a (checked) meta dict: for
    callers that still hold the dict while the consumers move to the typed plan."""
    return value if isinstance(value, Plan) else plan_from_meta(value)


def render_meta(meta: Mapping[str, Any], *, final_newline: bool = True) -> bytes:
    """A meta's file bytes: sorted keys, indent 2, ASCII; hpcodegen ends the file with a
    newline (:func:`hpcodegen.artifact.bundle.dump_meta`), the existing system does not."""
    text = json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=True)
    return (text + ("\n" if final_newline else "")).encode("ascii")
