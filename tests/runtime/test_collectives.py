"""``TPOps`` binding: name-free calls matched to transitions, each with its own backward."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.plan.classify import classify_boundary
from hpcodegen.plan.codec import entry_from_json

pytestmark = pytest.mark.timeout(400)

#: an input and an output that both lower to all_reduce, with different backwards: the
#: input (replicated inside a compute-splitting boundary) all-reduces its gradient, the
#: output's gradient arrives replicated and passes through.
ENTRY = {
    "params": {"proj.weight": {"tp": "S(0)"}},
    "in_src": {"x": {"tp": "P(sum)"}}, "in_dst": {"x": {"tp": "R"}},
    "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "R"}},
}


def _form(fqn: str, entry: dict) -> Any:
    """The classifier's form of a JSON-shaped entry (typed on the way in)."""
    return classify_boundary(fqn, entry_from_json(fqn, entry), ("tp",))


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

    from hpcodegen.runtime.collectives.matching import TPOps

    fake_world(2)
    form = _form("block", ENTRY)
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

    from hpcodegen.runtime.collectives.matching import TPOps

    fake_world(2)
    entry = {"params": {"w": {"tp": "S(0)"}},
             "out_src": {"output": {"tp": "S(-1)"}}, "out_dst": {"output": {"tp": "R"}}}
    form = _form("head", entry)
    ops = TPOps("head", form.transitions, dist.group.WORLD)
    out = ops.all_gather(torch.randn(2, 3, 4), dim=2)  # declared as dim=-1
    assert out.shape == (2, 3, 8)
    with pytest.raises(PlanError) as info:
        ops.reduce_scatter(torch.randn(2, 4), dim=0)
    assert info.value.findings[0].code == "runtime.unbound_call"
    assert info.value.findings[0].where == "head"



def test_no_grad_skips_autograd_but_not_the_collective(fake_world) -> None:
    """Under no_grad the ops run without an autograd node (and count the same); with grad,
    the replicated input of a compute-splitting boundary still all-reduces its gradient."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.runtime.collectives.matching import TPOps

    fake_world(2)
    entry = {"params": {"proj.weight": {"tp": "S(1)"}},
             "in_src": {"x": {"tp": "R"}}, "in_dst": {"x": {"tp": "R"}},
             "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "R"}}}
    form = _form("block", entry)
    ops = TPOps("block", form.transitions, dist.group.WORLD)
    assert {"to_local", "all_reduce"} <= set(vars(ops))  # one per kind: bound directly
    x = torch.randn(2, 4, requires_grad=True)
    with torch.no_grad(), CommDebugMode() as mode:
        y = ops.to_local(x)
        z = ops.all_reduce(y * 2)
    assert not y.requires_grad and y.grad_fn is None and z.grad_fn is None
    assert mode.get_total_counts() == 1
    y = ops.to_local(x)
    assert y.grad_fn is not None
    z = ops.all_reduce(y * 2)
    assert _backward_all_reduces(lambda: z.sum().backward()) == 1  # the input's, not z's

def test_identity_forward_backward_step_runs_once_on_the_summed_gradient() -> None:
    """Megatron's f (identity forward, a collective on the gradient) used by several
    branches runs its backward step once, on the gradient summed over them, also when
    activation checkpointing re-runs the forward (either mode); under no_grad it detaches."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from hpcodegen.runtime.collectives.autograd import apply_lowered

    calls: list[int] = []

    def doubled(grad):  # stands in for the all_reduce of a partial gradient
        calls.append(1)
        return grad * 2

    f = apply_lowered(None, doubled)
    gen = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    x0 = torch.randn(4, 3, generator=gen)

    def branches(h):
        y = f(h)
        return (y @ w1).tanh().sum() + (y @ w2).pow(2).sum()

    x = x0.clone().requires_grad_()
    branches(x * 1.5).backward()
    h = (x0 * 1.5).requires_grad_()
    expected = torch.autograd.grad((h @ w1).tanh().sum() + (h @ w2).pow(2).sum(), h)[0] * 3
    assert len(calls) == 1 and torch.allclose(x.grad, expected)
    for reentrant in (False, True):
        xc = x0.clone().requires_grad_()
        checkpoint(branches, xc * 1.5, use_reentrant=reentrant).backward()
        assert torch.allclose(xc.grad, expected)
    with torch.no_grad():
        assert not f(torch.randn(2, requires_grad=True)).requires_grad


def _gloo_collectives() -> dict:
    """On each rank: the c10d collectives against their single-process definition."""
    import torch
    import torch.distributed as dist

    from hpcodegen.runtime.collectives.ops import gather, reduce, scatter

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    full = [torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6) * (r + 1)
            for r in range(world)]
    x = full[rank]
    kept = x.clone()
    total = sum(full)
    checks = {
        "reduce": torch.equal(reduce(x, group), total),
        "reduce_leaves_input": torch.equal(x, kept),
        "reduce_noncontiguous": torch.equal(reduce(x.transpose(0, 2), group),
                                            total.transpose(0, 2)),
        "scatter_uneven": torch.equal(scatter(x[:, :3], 1, group),
                                      total[:, :3].chunk(world, 1)[rank]),
    }
    for dim in (0, 1, -1):
        # rank r contributes chunk r of its own tensor; the gather is their concatenation
        mine = [t.chunk(world, dim)[r] for r, t in enumerate(full)]
        checks[f"gather_{dim}"] = torch.equal(gather(mine[rank], dim, group), torch.cat(mine, dim))
        checks[f"scatter_{dim}"] = torch.equal(scatter(x, dim, group),
                                               total.chunk(world, dim)[rank])
    return checks


@pytest.mark.gloo
def test_c10d_collectives_on_gloo(gloo) -> None:
    """all_gather_single / reduce_scatter_single run on gloo for every dim; all_reduce
    reduces a copy (the caller's tensor keeps its value)."""
    for rank, checks in enumerate(gloo(2, _gloo_collectives)):
        assert all(checks.values()), (rank, checks)


def test_traced_binding_runs_the_same_ops_and_checks(fake_world) -> None:
    """``TPOps.bind_traced`` (what ``compile_parallelized`` binds before compiling) keeps
    the eager behaviour: the collectives, the backward, the dim matching and its errors."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.runtime.collectives.matching import TPOps

    fake_world(2)
    assert not TPOps("block", _form("block", ENTRY).transitions,
                     dist.group.WORLD).bind_traced()  # a kind declared twice: call order rules
    entry = {"params": {"w": {"tp": "S(0)"}},
             "out_src": {"output": {"tp": "S(-1)"}}, "out_dst": {"output": {"tp": "R"}}}
    ops = TPOps("head", _form("head", entry).transitions,
                dist.group.WORLD)
    assert ops.bind_traced()
    assert ops.all_gather(torch.randn(2, 3, 4), dim=2).shape == (2, 3, 8)  # -1 == 2 here
    assert ops.to_local(torch.ones(2)).shape == (2,)  # undeclared: unwraps only
    with pytest.raises(PlanError) as info:
        ops.all_gather(torch.randn(2, 4), dim=0)
    assert info.value.findings[0].code == "runtime.unbound_call"
    entry = {"params": {"proj.weight": {"tp": "S(1)"}},
             "in_src": {"x": {"tp": "R"}}, "in_dst": {"x": {"tp": "R"}},
             "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "R"}}}
    ops = TPOps("block", _form("block", entry).transitions,
                dist.group.WORLD)
    assert ops.bind_traced()
    x = torch.randn(2, 4, requires_grad=True)
    with torch.no_grad(), CommDebugMode() as mode:
        z = ops.all_reduce(ops.to_local(x) * 2)
    assert z.grad_fn is None and mode.get_total_counts() == 1
    z = ops.all_reduce(ops.to_local(x) * 2)
    assert _backward_all_reduces(lambda: z.sum().backward()) == 1  # the input's, not z's
