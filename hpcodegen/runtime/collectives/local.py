"""What every lowered collective shares: the local-tensor walker and the compile switch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpcodegen.runtime.identity import unwrap_local

LocalFn = Callable[[torch.Tensor], torch.Tensor]

#: True while dynamo traces: the lowered ops switch to the functional collectives
compiling = torch.compiler.is_compiling


def map_local_tensors(value: Any, leaf: LocalFn) -> Any:
    """``leaf`` applied to every local tensor of ``value``: a DTensor is unwrapped to its
    local shard, tuples and lists are walked (nested, type kept), anything else is returned
    as is. The one walker of the lowered ops and the generic engine."""
    value = unwrap_local(value)
    if isinstance(value, (tuple, list)):
        return type(value)(map_local_tensors(v, leaf) for v in value)
    return leaf(value) if isinstance(value, torch.Tensor) else value
