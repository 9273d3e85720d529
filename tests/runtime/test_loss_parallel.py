"""vocab_parallel_cross_entropy against F.cross_entropy (one gloo rank, in process: the
math; the 2-rank split runs in tests/launch/test_compile_loss_parallel.py)."""

from __future__ import annotations

import pytest


@pytest.mark.timeout(400)
def test_matches_cross_entropy_and_its_gradient(tmp_path) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from hpcodegen.runtime.loss import vocab_parallel_cross_entropy

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    try:
        gen = torch.Generator().manual_seed(0)
        logits = (torch.randn(2, 5, 11, generator=gen) * 4).requires_grad_()
        labels = torch.randint(0, 11, (2, 5), generator=gen)
        labels[0, 1] = -100  # ignored
        ref = logits.detach().clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(logits, labels, vocab_size=11)
        expected = F.cross_entropy(ref.flatten(0, 1), labels.flatten())
        loss.backward()
        expected.backward()
        assert torch.allclose(loss, expected, atol=1e-6)
        assert torch.allclose(logits.grad, ref.grad, atol=1e-6)
        assert logits.grad[0, 1].abs().max() == 0  # the ignored token has no gradient
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(400)
def test_compiles_whole_with_the_same_loss_and_gradient(tmp_path) -> None:
    """A user script may compile its loss too: under dynamo the three all_reduces are
    functional collectives, in one graph (``fullgraph=True``: no break)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from hpcodegen.runtime.loss import vocab_parallel_cross_entropy

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    try:
        torch._dynamo.reset()
        gen = torch.Generator().manual_seed(0)
        logits = (torch.randn(2, 5, 11, generator=gen) * 4).requires_grad_()
        labels = torch.randint(0, 11, (2, 5), generator=gen)
        labels[1, 3] = -100
        ref = logits.detach().clone().requires_grad_()
        compiled = torch.compile(vocab_parallel_cross_entropy, fullgraph=True)
        loss = compiled(logits, labels, dist.group.WORLD, vocab_size=11)
        expected = F.cross_entropy(ref.flatten(0, 1), labels.flatten())
        loss.backward()
        expected.backward()
        assert torch.allclose(loss.detach(), expected.detach(), atol=1e-6)
        assert torch.allclose(logits.grad, ref.grad, atol=1e-6)
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()
