"""Global-norm clipping on one process: the same norm and the same clipped gradients as
torch's ``clip_grad_norm_`` (tied parameters once; p=2 and p=inf). The sharded case runs on
gloo ranks against the unsharded model in tests/launch/test_checkpoints.py."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.timeout(400)


def _pair():
    import torch

    def make():
        torch.manual_seed(4)
        model = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Linear(6, 10))
        model[1].weight = model[0].weight  # tied, as an LM head
        model(torch.arange(7)).pow(2).sum().backward()
        return model

    return make(), make()


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.1, 1e6])
def test_matches_torch(norm_type, max_norm) -> None:
    import torch

    from hpcodegen.checkpoint import ShardLayout, clip_grad_norm_
    from hpcodegen.checkpoint.layout import global_shapes

    ours, ref = _pair()
    layout = ShardLayout.from_model(ours, global_shapes(ours), None)
    assert layout.aliases == {"1.weight": "0.weight"}
    got = clip_grad_norm_(ours, max_norm, norm_type, layout=layout)
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm, norm_type)
    assert torch.allclose(got, want, rtol=1e-6)
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=0)


def test_strided_shards_split_their_axis() -> None:
    """A fused gate_up over tp is ``SS(d,f)``: torch's ``is_shard()`` says False for it, yet
    each rank holds part of the tensor, so the norm must be summed over that axis."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    from hpcodegen.checkpoint.layout import splits

    assert splits(Shard(0)) and splits(_StridedShard(1, split_factor=2))
    assert not splits(Replicate()) and not splits(Partial())


def test_missing_gradient_counts_zero_and_bad_norm_type_is_refused() -> None:
    import torch

    from hpcodegen.checkpoint import ShardLayout, clip_grad_norm_
    from hpcodegen.checkpoint.clip import total_grad_norm
    from hpcodegen.checkpoint.layout import global_shapes

    ours, ref = _pair()
    for model in (ours, ref):
        model.add_module("unused", torch.nn.Linear(2, 2))  # no gradient, as an idle expert
    layout = ShardLayout.from_model(ours, global_shapes(ours), None)
    got = clip_grad_norm_(ours, 0.1)
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    assert torch.allclose(got, want, rtol=1e-6) and ours.unused.weight.grad is None
    for bad in (0.0, -1.0, -math.inf):
        with pytest.raises(ValueError, match="norm_type"):
            total_grad_norm(ours, bad, layout=layout)
