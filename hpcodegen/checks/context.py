"""What every check receives: the loaded meta, the artifact dir and the optional HF config.

Checks read the meta defensively (it may violate the schema: the ``schema`` check reports
that, the others must still not crash), so this module also holds the small typed readers
they share (the JSON pointer builder is :func:`hpcodegen.errors.pointer`, re-exported).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcodegen.artifact.load import LoadedMeta
from hpcodegen.errors import pointer

if TYPE_CHECKING:
    from hpcodegen.plan.decode import DecodedMeta
    from hpcodegen.plan.types import Plan

__all__ = ["CheckContext", "SkipCheck", "as_dict", "as_list", "plan_entries",
           "pointer"]


class SkipCheck(Exception):
    """Raised by a check (before yielding) when it cannot run; the message says why."""


#: What verify cannot check without a model config, in one line (the model check's skip
#: reason; here so the registry can say it without importing that check's torch-side module).
NEEDS_CONFIG = ("needs --hf-config PATH: derived outputs, partial gradients, tp_rank0_params, "
                "ops needing a collective, model class and uncovered parameters")


@dataclass
class CheckContext:
    """Inputs of one artifact's checks.

    Attributes:
        loaded: the parsed meta (``data``, ``meta_path``, ``artifact_dir``, duplicate keys).
        hf_config: the HF ``config.json`` as a dict, when ``--hf-config`` was given.
        hf_config_path: where that config was read from.
        cache: per-artifact memo shared by checks (e.g. the schema errors).
        allowed_targets: module prefixes the user trusts for injection targets
            (``--allow-target``), besides the registry of :mod:`hpcodegen.targets`.
        live_sizes: ``--mesh`` axis sizes the model check re-derives at (None: the frozen
            ``parallel_dims``).
    """

    loaded: LoadedMeta
    hf_config: dict[str, Any] | None = None
    hf_config_path: Path | None = None
    cache: dict[str, Any] = field(default_factory=dict)
    allowed_targets: tuple[str, ...] = ()
    live_sizes: dict[str, int] | None = None

    @property
    def meta(self) -> dict[str, Any]:
        return self.loaded.data

    @property
    def decoded(self) -> DecodedMeta:
        """Every value of the meta that decodes, and each refused leaf
        (:func:`hpcodegen.plan.codec.plan_from_meta` with ``refused``); built once per
        artifact. The ``plan`` check's field rules read it: they report on a meta the
        schema rejects, leaf by leaf."""
        if "decoded" not in self.cache:
            from hpcodegen.plan.codec import plan_from_meta
            from hpcodegen.plan.decode import DecodedMeta

            refused: list[Any] = []
            plan = plan_from_meta(self.meta, entry_keys=self.entry_keys(), refused=refused)
            self.cache["decoded"] = DecodedMeta(plan, tuple(refused))
        return self.cache["decoded"]

    @property
    def plan(self) -> Plan:
        """The typed plan of the meta's parts that parse (:func:`hpcodegen.plan.codec.
        readable_plan`: what the codec refuses is left out, the schema check reports it);
        built once per artifact. The semantic checks read it. A meta the codec accepts
        whole is decoded once: this is :attr:`decoded`'s plan."""
        if "plan" not in self.cache:
            decoded = self.decoded
            if decoded.refused:
                from hpcodegen.plan.codec import readable_plan

                self.cache["plan"], self.cache["plan_left_out"] = readable_plan(
                    self.meta, entry_keys=self.entry_keys())
            else:
                self.cache["plan"], self.cache["plan_left_out"] = decoded.plan, []
        return self.cache["plan"]

    def entry_keys(self) -> dict[str, str | bytes | None]:
        """Each object-shaped ``param_plan`` entry's :func:`~hpcodegen.json_key.json_key`,
        computed once per artifact: the checks that judge an entry by its content alone
        (the schema, the placement leaves) judge each distinct content once, and a
        10,000-entry plan has a handful (every layer repeats the one before)."""
        if "entry_keys" not in self.cache:
            from hpcodegen.json_key import json_key

            entries = plan_entries(self.meta.get("param_plan"))
            self.cache["entry_keys"] = {fqn: json_key(e) for fqn, e in entries.items()}
        return self.cache["entry_keys"]

    def plan_left_out(self) -> list[Any]:
        """The codec's refusals :attr:`plan` left out (``PlanFormatError``; empty for a
        meta the schema accepts)."""
        _ = self.plan
        return self.cache["plan_left_out"]

    def sizes(self) -> dict[str, int]:
        """The axis sizes the plan is judged at: the frozen ones, with ``--mesh`` over them
        (an axis of size 1 splits nothing, and is no error)."""
        return {**self.plan.dims.sizes, **(self.live_sizes or {})}

    @property
    def artifact_dir(self) -> Path:
        return self.loaded.artifact_dir

    @property
    def meta_file(self) -> str:
        return str(self.loaded.meta_path)

    def require_artifact_dir(self) -> Path:
        """The artifact directory, or :class:`SkipCheck` for a bare meta file: its folder is
        not an artifact and is never read (the files checks need a directory)."""
        if self.loaded.bare:
            raise SkipCheck("a meta file alone: there is no artifact directory to check "
                            "(verify the artifact's directory for its files)")
        return self.loaded.artifact_dir

    def require_hf_config(self) -> dict[str, Any]:
        """The HF config, or :class:`SkipCheck` saying which option provides it."""
        if self.hf_config is None:
            raise SkipCheck("needs --hf-config PATH (a config.json or a model dir)")
        return self.hf_config


def as_dict(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a JSON object, else an empty mapping (the schema reports it)."""
    if type(value) is dict:  # what json gives: skips the ABC check (called per leaf)
        return value
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a JSON array, else an empty list (the schema reports it)."""
    return value if isinstance(value, list) else []


def plan_entries(param_plan: Any) -> dict[str, Mapping[str, Any]]:
    """The entries of a ``param_plan`` JSON value that are objects (others are schema
    errors; a value that is no object has none)."""
    return {fqn: e for fqn, e in as_dict(param_plan).items()
            if type(e) is dict or isinstance(e, Mapping)}  # JSON's dicts skip the ABC check
