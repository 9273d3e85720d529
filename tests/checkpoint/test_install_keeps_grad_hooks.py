"""The sharded loader swaps each local shard into the meta parameter: the gradient hooks the
runtime put there at install (tp-partial gradients' all-reduce) must still fire afterwards.
They did not: a launch with safetensors weights (or a resume) of a sequence-parallel artifact
left every SP norm's gradient unreduced."""

from __future__ import annotations


def test_hooks_and_flags_move_with_the_swapped_shard() -> None:
    import torch
    from torch import nn

    from hpcodegen.checkpoint.shard_load import _install
    from hpcodegen.runtime.grad_sync import install_grad_hook

    model = nn.Linear(3, 2, bias=False)
    with torch.device("meta"):
        model.weight = nn.Parameter(torch.empty(2, 3))
    install_grad_hook(model, ["weight"], lambda g: g * 10, "_hp_test_flag")
    _install(model, "weight", torch.ones(2, 3))
    assert model.weight.device.type == "cpu"
    model(torch.ones(1, 3)).sum().backward()
    assert torch.equal(model.weight.grad, torch.full((2, 3), 10.0))  # once, not 0 or twice
