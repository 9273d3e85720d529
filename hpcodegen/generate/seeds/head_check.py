"""Does an attention's forward run on one rank's heads? Asked by running it (lazy torch).

Splitting an attention by heads hands each rank ``heads / tp`` of every projection's
output; the forward between the projections must then size its tensors from those, not
from the full width. transformers' attentions differ exactly there: most reshape with
``-1``, some with a head-count attribute the runtime divides (``num_heads``), some with a
width attribute (XGLM's ``self.embed_dim``) and some with the width of their *input*
(TrOCR's ``bsz, tgt_len, embed_dim = hidden_states.size()``), which no attribute can fix.
The source cannot tell these apart reliably; one run can. The module is copied on the
meta device with its column-parallel projections cut to ``1/t`` of their rows, its
row-parallel projection to ``1/t`` of its columns and the attributes the runtime would
divide divided, and called on meta tensors of the shapes its call had in the model's
traced forward (:class:`hpcodegen.tracer.dataflow.Flow` ``calls``): it must run and
return what the whole module returned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hpcodegen.generate.seeds.seeds import is_linear
from hpcodegen.generate.sources.styles import Kind
from hpcodegen.tracer.dataflow import all_on_meta, rebuilt


def _cut(linear: Any, kind: Kind, t: int) -> None:
    """Keep ``1/t`` of a Linear's rows (colwise) or columns (rowwise), on meta."""
    import torch

    weight = linear.weight
    if kind is Kind.COLWISE:
        shape = (weight.shape[0] // t, weight.shape[1])
        linear.out_features = shape[0]
        if linear.bias is not None:
            linear.bias = torch.nn.Parameter(torch.zeros(shape[0], device="meta"))
    else:
        shape = (weight.shape[0], weight.shape[1] // t)
        linear.in_features = shape[1]
    linear.weight = torch.nn.Parameter(torch.zeros(shape, device="meta"))


def runs_on_heads(module: Any, styles: Mapping[str, Kind], attrs: Sequence[str],
                  call: tuple[Any, Any, Any], t: int) -> bool | None:
    """Whether ``module`` with its projections cut to ``1/t`` (``styles``) and ``attrs``
    divided by ``t`` returns the shape it returned whole; None when the recorded call does
    not replay on meta even whole (data-dependent code: nothing can be said)."""
    import copy

    import torch

    args, kwargs, shape = call

    def replay(m: Any) -> bool:
        with torch.no_grad(), torch.device("meta"), all_on_meta(m):
            out = m(*rebuilt(args), **rebuilt(kwargs))
        first = out[0] if isinstance(out, (tuple, list)) else out
        return tuple(getattr(first, "shape", ())) == shape

    try:
        if not replay(module):
            return None
    except Exception:  # model code may not replay on meta: no verdict
        return None
    cut = copy.deepcopy(module)
    for name, kind in styles.items():
        child = getattr(cut, name, None)
        if is_linear(child) and kind in (Kind.COLWISE, Kind.ROWWISE):
            _cut(child, kind, t)
    for attr in attrs:
        setattr(cut, attr, getattr(cut, attr) // t)
    try:
        return replay(cut)
    except Exception:  # the cut module fails: it sizes something by the full width
        return False


def width_attrs(module: Any, width: int, source: str) -> list[str]:
    """Integer attributes of ``module`` its forward reads whose value is ``width`` (the
    heads' total width, which a rank holds ``1/tp`` of): XGLM's ``embed_dim``."""
    read = set(re.findall(r"self\.(\w+)", source))
    return sorted(n for n, v in vars(module).items() if n in read and isinstance(v, int)
                  and not isinstance(v, bool) and v == width)


def smallest_split(*counts: int) -> int | None:
    """The smallest ``t > 1`` dividing every count: the cheapest split to try."""
    for t in range(2, min(counts) + 1):
        if all(c % t == 0 for c in counts):
            return t
    return None
