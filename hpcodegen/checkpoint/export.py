"""``hpcodegen export CKPT -o HF_DIR``: a saved checkpoint back to an HF model directory.

Reads the DCP checkpoint in this one process (no process group; DCP assembles each
parameter's global tensor from its saved chunks) and writes ``config.json`` (the recorded
config, ``dtype`` set to the saved dtype) plus safetensors under the original
model's names and shapes, split into ``model-0000i-of-0000n.safetensors`` with a
``model.safetensors.index.json`` when larger than ``max_shard_bytes`` (as transformers'
``save_pretrained`` does). Tied aliases are left out like transformers leaves them out.
At most one output file's tensors are in memory at a time. The directory appears whole or
not at all (written to a new hidden sibling, then renamed).

The checkpoint is untrusted input: its record, metadata and file digests are checked
first (:func:`hpcodegen.checkpoint.integrity.open_checkpoint`), and the parameters written
are the ones the model built from the recorded config has, each of which the checkpoint
must hold in its shape: the record cannot drop or reshape a parameter.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hpcodegen.checkpoint.record import check_target
from hpcodegen.errors import EXIT_OK, HpcodegenError, InputError, error

DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


def _plan_files(params: dict[str, tuple[int, ...]], itemsize: int,
                limit: int) -> list[list[str]]:
    files: list[list[str]] = [[]]
    size = 0
    for fqn, shape in params.items():
        nbytes = _numel(shape) * itemsize
        if files[-1] and size + nbytes > limit:
            files.append([])
            size = 0
        files[-1].append(fqn)
        size += nbytes
    return files


def _load(checked: Any, names: list[str], params: dict[str, tuple[int, ...]]) -> dict:
    import torch

    from hpcodegen.checkpoint.dcp_safe import load

    state = {f"model.{n}": torch.empty(params[n], dtype=checked.dtype) for n in names}
    load(state, checked.directory, checked.metadata, no_dist=True)
    return {n: state[f"model.{n}"].contiguous() for n in names}


def model_params(record: dict[str, Any], directory: Path) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of the model the recorded config builds (tied names once, as
    transformers saves them), checked against the record's list.

    Raises:
        InputError: the recorded config builds no model, or the record lists other
            parameters or shapes than that model has.
    """
    from hpcodegen.hf import build_meta_model

    try:
        model = build_meta_model(record["config"])
    except HpcodegenError as exc:
        raise InputError([error("checkpoint.config", str(directory),
                                "the recorded config builds no model: "
                                + "; ".join(f.message for f in exc.findings[:2]))]) from None
    want = {name: tuple(p.shape) for name, p in model.named_parameters()}
    saved = {name: tuple(spec["shape"]) for name, spec in record["params"].items()}
    problems = [f"{n}: missing" for n in want if n not in saved]
    problems += [f"{n}: not a parameter of the model" for n in saved if n not in want]
    problems += [f"{n}: shape {saved[n]}, the model's {want[n]}" for n in want
                 if n in saved and saved[n] != want[n]]
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise InputError([error("checkpoint.params", str(directory),
                                "the record does not list the model's parameters: "
                                + "; ".join(problems[:3]) + more)])
    return want


def export_hf(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *,
              max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Write ``out`` (config.json + safetensors) from the checkpoint at ``checkpoint``.

    Raises:
        InputError: ``checkpoint`` is not an intact hpcodegen checkpoint of the model its
            config describes (exit 2).
        UsageError: ``out`` exists and is not an empty directory, cannot be created, or
            ``max_shard_bytes`` is not a positive size (exit 2).
    """
    import tempfile

    from safetensors.torch import save_file

    from hpcodegen.bounds import MAX_SHARD_BYTES, int_problem
    from hpcodegen.checkpoint.integrity import open_checkpoint
    from hpcodegen.errors import UsageError

    bad = int_problem("export.max_shard_bytes", "--max-shard-bytes", max_shard_bytes, 1,
                      MAX_SHARD_BYTES)
    if bad:
        raise UsageError(bad)
    source, target = Path(checkpoint), Path(os.path.abspath(out))
    check_target(target)  # before the checkpoint is read (and hashed)
    checked = open_checkpoint(source, digests="all")
    check_target(target)
    record = checked.record
    params = model_params(record, source)
    dtype = checked.dtype
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial",
                                  dir=target.parent))
    try:
        groups = _plan_files(params, dtype.itemsize, max_shard_bytes)
        weight_map = {}
        for i, names in enumerate(groups, start=1):
            name = ("model.safetensors" if len(groups) == 1
                    else f"model-{i:05d}-of-{len(groups):05d}.safetensors")
            save_file(_load(checked, names, params), str(stage / name),
                      metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(names, name))
        if len(groups) > 1:
            total = sum(dtype.itemsize * _numel(params[n]) for n in params)
            (stage / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        config = dict(record["config"])
        for key in ("dtype", "torch_dtype"):  # transformers 5 writes dtype, 4 torch_dtype
            if key in config or key == "dtype":
                config[key] = record.get("dtype") or "float32"
        (stage / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if target.exists():
            target.rmdir()
        os.replace(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)  # ours: made by mkdtemp above
        raise
    return target


def _numel(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def run_export(checkpoint: Path, out: Path, max_shard_bytes: int, *, as_json: bool = False,
               verbosity: int = 0) -> int:
    """The CLI verb's body: export, then say where (the JSON envelope under ``--json``).

    Refusals raise (``HpcodegenError``); the verb's guard prints them and their exit code.
    """
    from hpcodegen.report.envelope import emit

    target = export_hf(checkpoint, out, max_shard_bytes=max_shard_bytes)
    files = sorted(p.name for p in target.iterdir())
    if as_json:
        return emit("export", EXIT_OK, [], sys.stdout, out=str(target), files=files)
    if verbosity >= 0:
        print(f"exported {checkpoint} -> {target} ({', '.join(files)})")
    return EXIT_OK
