"""How an artifact was generated, recorded in its meta, and read back by ``generate --check``.

A meta our generator writes carries ``generator.inputs``: where the model's config came from
(``model_dir``, relative to the artifact directory, or ``hub_id``), the recipe, if any
(``recipe``, relative too), and ``--cp-method`` / ``--ulysses`` when given otherwise than the
default (``cp_method``, ``ulysses``: the plan shows only the method ``auto`` resolved to).
The other parallel options are not repeated there: ``parallel_dims`` already records tp,
sp, ep, cp, the cp layout and loss parallel, and is read back from there. Relative paths
keep the bytes reproducible: the same checkout generates the same meta wherever it lies. The
record is provenance, outside the signature (decisions.md item
5: the signature covers the generator's version, not ``generator.inputs``), like
``yaml_path``; the existing system ignores the key.

So ``hpcodegen generate --check DIR`` needs no flags: :func:`complete_args` fills every
option the command line left out from the meta. A meta without the record (another
generator's, or one written before hpcodegen recorded it) is a usage error naming the flags
it needs. Pure: no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcodegen.errors import UsageError, error

if TYPE_CHECKING:
    from hpcodegen.generate.api import GenerateArgs

#: the key under ``generator`` that holds the record
INPUTS_KEY = "inputs"
#: ``--cp-method`` when not given (not recorded, so artifacts without it keep their bytes)
DEFAULT_CP_METHOD = "allgather"


def _relative(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> str:
    """``path`` relative to the artifact dir ``out``, with ``/`` separators."""
    target = os.path.abspath(path)
    try:
        rel = os.path.relpath(target, os.path.abspath(out))
    except ValueError:  # another drive (Windows): only an absolute path can say where
        rel = target
    return Path(rel).as_posix()


def generation_record(model: str | os.PathLike[str], recipe: str | os.PathLike[str] | None,
                      out: str | os.PathLike[str], hub_id: bool, cp_method: str | None = None,
                      ulysses: int | None = None,
                      pp_layout: tuple[int, ...] | None = None) -> dict[str, Any]:
    """``generator.inputs`` of an artifact generated from ``model`` (a config dir or file, or
    a Hub id) and ``recipe`` into ``out``; with ``--cp-method`` other than the default
    (``parallel_dims`` does not hold it: the plan shows only the method it resolved to),
    ``--ulysses`` and ``--pp-layout``, as given (the ``pipeline`` section holds the other pp
    options; without a layout its split is the default one, which a rerun chooses again)."""
    record: dict[str, Any] = ({"hub_id": os.fspath(model)} if hub_id
                              else {"model_dir": _relative(model, out)})
    if recipe is not None:
        record["recipe"] = _relative(recipe, out)
    if cp_method not in (None, DEFAULT_CP_METHOD):
        record["cp_method"] = cp_method
    if ulysses is not None:
        record["ulysses"] = ulysses
    if pp_layout is not None:
        record["pp_layout"] = list(pp_layout)
    return record


def _needs_flags(meta_file: str, why: str) -> UsageError:
    return UsageError([error(
        "generate.check_needs_flags", "/generator/inputs", f"{why}: --check cannot tell "
        "which model it was made from", file=meta_file,
        expected="generator.inputs.model_dir or generator.inputs.hub_id",
        hint="pass --model DIR (the config it was made from) and --recipe FILE if it was made "
             "with one; tp, sp, ep, cp and loss parallel are read from parallel_dims unless "
             "given")])


def _string(record: Mapping[str, Any], key: str, meta_file: str) -> str | None:
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise UsageError([error("generate.check_bad_record", f"/generator/inputs/{key}",
                                f"generator.inputs.{key} is {value!r}", file=meta_file,
                                expected="a non-empty path string",
                                hint="pass the flag (--model / --recipe) instead")])
    return value


def _recorded_model(record: Mapping[str, Any], out: Path, meta_file: str) -> Path | None:
    hub = _string(record, "hub_id", meta_file)
    if hub is not None:
        return Path(hub)
    rel = _string(record, "model_dir", meta_file)
    return None if rel is None else out / rel


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def artifact_dir(out: Path | None, positional: Path | None, check: bool) -> Path | None:
    """The artifact of ``generate``: ``-o OUT``, or the positional ``DIR`` of ``--check DIR``
    (a usage error without ``--check``, or naming another dir than ``-o``)."""
    if positional is not None and not check:
        raise UsageError([error("generate.positional", "DIR", f"unexpected argument "
                                f"{os.fspath(positional)}: a positional DIR is for --check",
                                hint="hpcodegen generate --model DIR --tp N -o OUT")])
    if positional is not None and out is not None and Path(positional) != Path(out):
        raise UsageError([error("generate.two_outs", "-o", f"--check {os.fspath(positional)} "
                                f"and -o {os.fspath(out)} name two artifacts",
                                hint="give one")])
    return out if out is not None else positional


def complete_args(args: GenerateArgs) -> GenerateArgs:
    """``args`` with every option the command line left out (``None``) filled in.

    Without ``--check``, ``--model``, ``--tp`` and ``-o`` are required (a usage error names
    the missing ones) and ep and cp default to 1; so with ``--check`` when both ``--model``
    and ``--tp`` are given (the flags say it all, as before the record). Otherwise
    ``--check`` reads the artifact's meta: the model, recipe, cp method, Ulysses degree and
    pp layout from ``generator.inputs``, tp, sp, ep, cp, the cp layout and loss parallel from
    ``parallel_dims``, the other pp options from ``pipeline``; each flag given on the command
    line wins over its recorded value.

    Raises:
        UsageError: a required flag is missing, or the meta cannot say what it stands for.
        InputError: (``--check``) the artifact's meta cannot be read.
    """
    if not args.check or (args.model_dir is not None and args.tp is not None):
        missing = [flag for flag, value in (("--model", args.model_dir), ("--tp", args.tp),
                                            ("-o", args.out)) if value is None]
        if missing:
            raise UsageError([error("generate.missing_option", missing[0],
                                    f"generate needs {', '.join(missing)}",
                                    hint="hpcodegen generate --model DIR --tp N -o OUT; or "
                                         "--check DIR to regenerate an artifact as recorded")])
        return replace(args, ep=1 if args.ep is None else args.ep,
                       cp=1 if args.cp is None else args.cp,
                       cp_method=args.cp_method or DEFAULT_CP_METHOD)
    if args.out is None:
        raise UsageError([error("generate.missing_option", "-o", "--check needs the artifact "
                                "to compare with", hint="hpcodegen generate --check DIR")])
    from hpcodegen.artifact.load import META_NAME, load_meta

    loaded = load_meta(args.out)
    out = loaded.artifact_dir
    meta_file = os.fspath(loaded.meta_path)
    meta = loaded.data
    generator = meta.get("generator") if isinstance(meta.get("generator"), Mapping) else {}
    record = generator.get(INPUTS_KEY)
    record = record if isinstance(record, Mapping) else {}
    model = args.model_dir
    if model is None:
        model = _recorded_model(record, out, meta_file)
        if model is None:
            who = generator.get("name")
            raise _needs_flags(meta_file, "the meta records no generation inputs "
                               "(generator.inputs)" + (f"; it was written by {who!r}"
                                                       if isinstance(who, str)
                                                       and who != "hpcodegen" else ""))
        if "model_dir" in record and not model.exists():
            raise UsageError([error(
                "generate.check_model_missing", "/generator/inputs/model_dir",
                f"the recorded model dir {record['model_dir']} ({os.fspath(model)}) does not "
                "exist", file=meta_file, hint="pass --model DIR")])
    recipe = args.recipe
    if recipe is None:
        rel = _string(record, "recipe", meta_file)
        recipe = None if rel is None else out / rel
    dims = meta.get("parallel_dims") if isinstance(meta.get("parallel_dims"), Mapping) else {}
    layout = dims.get("cp_layout")
    method = record.get("cp_method")
    degree = record.get("ulysses")
    return replace(
        args, model_dir=model, recipe=recipe,
        out=out if Path(args.out).name == META_NAME else args.out,
        tp=args.tp if args.tp is not None else _int(dims.get("tp_size"), 1),
        ep=args.ep if args.ep is not None else _int(dims.get("ep_size"), 1),
        cp=args.cp if args.cp is not None else _int(dims.get("cp_size"), 1),
        cp_layout=args.cp_layout or (layout if isinstance(layout, str) else None),
        cp_method=args.cp_method or (method if isinstance(method, str) else DEFAULT_CP_METHOD),
        ulysses=args.ulysses if args.ulysses is not None else (
            degree if isinstance(degree, int) and not isinstance(degree, bool) else None),
        sp=args.sp or dims.get("sequence_parallel") is True,
        loss_parallel=args.loss_parallel or dims.get("loss_parallel") is True,
        pipeline=args.pipeline or _recorded_pipeline(meta.get("pipeline"), record))


def _recorded_pipeline(section: Any, record: Mapping[str, Any]) -> Any:
    """The ``--pp`` options of a pipelined artifact, from its ``pipeline`` section (pp size,
    schedule, microbatches, stages per rank) and the recorded ``--pp-layout``; None for an
    artifact without a pipeline. Values of the wrong type fall back to the defaults, and
    the regenerated section is compared with the recorded one, so a hand-edit shows as
    drift."""
    if not isinstance(section, Mapping):
        return None
    from hpcodegen.generate.layouts.pipeline import PipelineArgs

    layout = record.get("pp_layout")
    counts = (tuple(layout) if isinstance(layout, list) and layout
              and all(isinstance(n, int) and not isinstance(n, bool) for n in layout)
              else None)
    schedule = section.get("schedule")
    microbatches = section.get("n_microbatches")
    return PipelineArgs(_int(section.get("pp_size"), 1),
                        schedule if isinstance(schedule, str) else PipelineArgs.schedule,
                        microbatches if isinstance(microbatches, int)
                        and not isinstance(microbatches, bool) else None,
                        counts, _int(section.get("stages_per_rank"), 2))


__all__ = ["INPUTS_KEY", "artifact_dir", "complete_args", "generation_record"]
