"""``hpcodegen.tracer.ops.tensors`` walks plain nests itself: it must find the very tensors
torch's pytree finds, in the same order (every watcher reads "the first tensor" of an op's
operands or a module's output), for plain nests and for what only pytree knows (a named
tuple, an ``OrderedDict``, a transformers ``ModelOutput``, torch's ``return_types``)."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")


def _nests() -> list[object]:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    pair = collections.namedtuple("pair", "a b")
    a, b, c, d = (torch.zeros(i + 1) for i in range(4))
    return [
        a,
        (a, [b, {"x": c, "y": (d, 1, None)}]),
        {"dtype": torch.float32, "device": torch.device("meta"), "t": a, "n": 2.5},
        pair(a, (b, c)),
        CausalLMOutputWithPast(logits=a, hidden_states=(b, c)),
        collections.OrderedDict(z=b, a=a),
        torch.Size([2, 3]),
        [torch.nn.Parameter(torch.zeros(2)), 3.0, "s", torch.strided, torch.contiguous_format],
        torch.max(torch.zeros(3, 2), 1),
        ([a, b], {"o": collections.OrderedDict(q=(c,)), "p": [pair(d, None)]}),
        None,
        5,
    ]


@pytest.mark.parametrize("index", range(12))
def test_the_tensors_found_are_pytrees_in_its_order(index: int) -> None:
    from torch.utils._pytree import tree_flatten

    from hpcodegen.tracer.ops import tensors

    nest = _nests()[index]
    want = [t for t in tree_flatten(nest)[0] if isinstance(t, torch.Tensor)]
    got = tensors(nest)
    assert [id(t) for t in got] == [id(t) for t in want], (nest, got, want)
