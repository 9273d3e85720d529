"""``hpcodegen_checkpoint.json``: what a saved checkpoint is, readable without torch.

Written next to the ``torch.distributed.checkpoint`` files of every checkpoint
:func:`hpcodegen.checkpoint.save` writes. It records what DCP does not: the HF config
(``export`` writes it back as ``config.json``), the artifact and its signature, the step,
the dtype, the mesh it was saved on and each parameter's global shape and placements, plus
tied aliases. The launcher reads it before starting anything, so a resume of another model
is refused as a usage error (exit 2), naming the config fields that differ.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcodegen.errors import InputError, UsageError, error
from hpcodegen.hf import architecture_of, structure_of

RECORD_NAME = "hpcodegen_checkpoint.json"
#: 2: the optimizer state as torch's ``get_optimizer_state_dict`` keys it; 1 (read for the
#: model weights and export): hpcodegen's own optimizer keys
FORMAT = "hpcodegen-checkpoint/2"
FORMAT_V1 = "hpcodegen-checkpoint/1"


def write_record(directory: Path, record: Mapping[str, Any]) -> None:
    """Atomically write ``directory/hpcodegen_checkpoint.json``."""
    target = Path(directory) / RECORD_NAME
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".record.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"format": FORMAT, **record}, fh, indent=1, sort_keys=True)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_record(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The record of a checkpoint directory; InputError (exit 2) when it is not one."""
    path = Path(directory) / RECORD_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError([error("checkpoint.not_found", str(directory),
                                f"not an hpcodegen checkpoint (no {RECORD_NAME})",
                                hint="save one with `hpcodegen launch ... --save DIR`")]) from None
    except (OSError, ValueError) as exc:
        raise InputError([error("checkpoint.unreadable", "", f"unreadable: {exc}",
                                file=str(path))]) from None
    if not isinstance(data, dict) or data.get("format") not in (FORMAT, FORMAT_V1) \
            or not isinstance(data.get("config"), dict):
        raise InputError([error("checkpoint.format", "/format",
                                f"not a {FORMAT} record", file=str(path))])
    return data


def check_same_model(record: Mapping[str, Any], config: Mapping[str, Any],
                     directory: str | os.PathLike[str]) -> None:
    """Refuse to resume a checkpoint of another model (architecture or shape fields).

    The tp and dp sizes may differ (DCP reshards); the model may not.
    """
    saved = record["config"]
    problems = []
    if architecture_of(saved) != architecture_of(config):
        problems.append(f"architecture {architecture_of(saved)!r} vs {architecture_of(config)!r}")
    a, b = structure_of(saved), structure_of(config)
    problems += [f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b))
                 if a.get(k) != b.get(k)]
    if problems:
        raise UsageError([error("checkpoint.other_model", str(directory),
                                "the checkpoint is of another model (checkpoint vs config): "
                                + "; ".join(problems),
                                hint="resume with the config the checkpoint was saved with")])


def check_target(directory: str | os.PathLike[str]) -> None:
    """Refuse to save over an existing non-empty directory (UsageError, exit 2)."""
    path = Path(directory)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError([error("checkpoint.target_exists", str(path),
                                "exists and is not an empty directory",
                                hint="write to a new or empty directory (nothing is "
                                     "overwritten)")])
