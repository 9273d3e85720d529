"""``TPOps`` binding: name-free calls matched to transitions, each with its own backward."""

from __future__ import annotations

from collections import Counter

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.plan.classify import classify_boundary

pytestmark = pytest.mark.timeout(60)

#: an input and an output that both lower to all_reduce, with different backwards: the
#: input (replicated inside a compute-splitting boundary) all-reduces its gradient, the
#: output's gradient arrives replicated and passes through.
ENTRY = {
    "params": {"proj.weight": {"tp": "S(0)"}},
    "in_src": {"x": {"tp": "P(sum)"}}, "in_dst": {"x": {"tp": "R"}},
    "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "R"}},
}


def _backward_all_reduces(fn) -> int:
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as mode:
        fn()
    # functional (``all_reduce``) or in-place c10d (``allreduce_``) spelling alike
    return sum(n for op, n in Counter(mode.get_comm_counts()).items()
               if "all_reduce" in str(op) or "allreduce" in str(op))


def test_same_kind_calls_bind_in_call_order(fake_world) -> None:
    import torch
    import torch.distributed as dist

    from hpcodegen.runtime.collectives import TPOps

    fake_world(2)
    form = classify_boundary("block", ENTRY, ("tp",))
    assert [t.grad_steps != () for t in form.transitions] == [True, False]
    ops = TPOps("block", form.transitions, dist.group.WORLD)
    for _ in range(2):  # the second forward wraps around to the input again
        x = torch.randn(2, 4, requires_grad=True)
        y = ops.all_reduce(x)  # input x
        z = ops.all_reduce(y * 2)  # output
        assert _backward_all_reduces(lambda z=z: z.sum().backward()) == 1
        x2 = torch.randn(2, 4, requires_grad=True)
        out = ops.all_reduce(x2 * 1.0)  # an input call again after the output
        assert _backward_all_reduces(lambda out=out: out.sum().backward()) == 1
        ops.all_reduce(out.detach())  # consume the output slot of that forward


def test_unknown_call_and_negative_dims(fake_world) -> None:
    import torch
    import torch.distributed as dist

    from hpcodegen.runtime.collectives import TPOps

    fake_world(2)
    entry = {"params": {"w": {"tp": "S(0)"}},
             "out_src": {"output": {"tp": "S(-1)"}}, "out_dst": {"output": {"tp": "R"}}}
    form = classify_boundary("head", entry, ("tp",))
    ops = TPOps("head", form.transitions, dist.group.WORLD)
    out = ops.all_gather(torch.randn(2, 3, 4), dim=2)  # declared as dim=-1
    assert out.shape == (2, 3, 8)
    with pytest.raises(PlanError) as info:
        ops.reduce_scatter(torch.randn(2, 4), dim=0)
    assert info.value.findings[0].code == "runtime.unbound_call"
    assert info.value.findings[0].where == "head"
