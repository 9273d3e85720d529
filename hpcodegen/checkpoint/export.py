"""``hpcodegen export CKPT -o HF_DIR``: a saved checkpoint back to an HF model directory.

Reads the DCP checkpoint in this one process (no process group; DCP assembles each
parameter's global tensor from its saved chunks) and writes ``config.json`` (the recorded
config, ``dtype`` set to the saved dtype) plus safetensors under the original
model's names and shapes, split into ``model-0000i-of-0000n.safetensors`` with a
``model.safetensors.index.json`` when larger than ``max_shard_bytes`` (as transformers'
``save_pretrained`` does). Tied aliases are left out like transformers leaves them out.
At most one output file's tensors are in memory at a time. The directory appears whole or
not at all (written to a hidden sibling, then renamed).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

from hpcodegen.checkpoint.record import check_target, read_record
from hpcodegen.errors import EXIT_OK

DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


def _plan_files(params: dict[str, Any], itemsize: int, limit: int) -> list[list[str]]:
    files: list[list[str]] = [[]]
    size = 0
    for fqn, spec in params.items():
        numel = 1
        for n in spec["shape"]:
            numel *= n
        nbytes = numel * itemsize
        if files[-1] and size + nbytes > limit:
            files.append([])
            size = 0
        files[-1].append(fqn)
        size += nbytes
    return files


def _load(directory: Path, names: list[str], params: dict[str, Any], dtype: Any) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    state = {f"model.{n}": torch.empty(params[n]["shape"], dtype=dtype) for n in names}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(directory), no_dist=True)
    return {n: state[f"model.{n}"].contiguous() for n in names}


def export_hf(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *,
              max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Write ``out`` (config.json + safetensors) from the checkpoint at ``checkpoint``.

    Raises:
        InputError: ``checkpoint`` is not an hpcodegen checkpoint (exit 2).
        UsageError: ``out`` exists and is not an empty directory (exit 2).
    """
    import torch
    from safetensors.torch import save_file

    source, target = Path(checkpoint), Path(out)
    record = read_record(source)
    check_target(target)
    dtype = getattr(torch, record.get("dtype") or "float32")
    params = record["params"]
    stage = target.parent / f".{target.name}.partial"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        groups = _plan_files(params, dtype.itemsize, max_shard_bytes)
        weight_map = {}
        for i, names in enumerate(groups, start=1):
            name = ("model.safetensors" if len(groups) == 1
                    else f"model-{i:05d}-of-{len(groups):05d}.safetensors")
            save_file(_load(source, names, params, dtype), str(stage / name),
                      metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(names, name))
        if len(groups) > 1:
            total = sum(dtype.itemsize * _numel(params[n]["shape"]) for n in params)
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
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return target


def _numel(shape: list[int]) -> int:
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
