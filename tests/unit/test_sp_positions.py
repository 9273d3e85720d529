"""Sequence parallelism's wrapper of a model forward (:mod:`hpcodegen.sp_positions`): the
arguments it reads and the ``position_ids`` it passes, whether the caller named them or
gave them by position (one slot lookup serves both, and the mask builders' wrapper)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpcodegen.sp_positions import full_length_masks, install_default_position_ids


class Cache:
    """What the wrapper reads of a KV cache: how many positions it has seen."""

    def __init__(self, seen: int) -> None:
        self.seen = seen

    def get_seq_length(self) -> int:
        return self.seen


class Parent(nn.Module):
    """Returns the ``position_ids`` it is handed, and the ``mask`` slot untouched."""

    def forward(self, input_ids: Any = None, position_ids: Any = None,
                past_key_values: Any = None, mask: Any = "m") -> tuple[Any, Any]:
        return position_ids, mask


def _wrapped() -> Parent:
    model = Parent()
    assert install_default_position_ids(model)
    assert install_default_position_ids(model)  # a second install is a no-op
    return model


def test_default_positions_by_keyword_and_by_slot() -> None:
    model, ids = _wrapped(), torch.zeros(1, 5, dtype=torch.long)
    expected = torch.arange(5).unsqueeze(0)
    got, mask = model(input_ids=ids)
    assert torch.equal(got, expected) and mask == "m"
    got, mask = model(ids, None, None, "x")  # all by position: the slot is replaced
    assert torch.equal(got, expected) and mask == "x"


def test_a_cache_offsets_the_positions_and_given_positions_are_kept() -> None:
    model, ids = _wrapped(), torch.zeros(1, 3, dtype=torch.long)
    got, _ = model(ids, past_key_values=Cache(4))
    assert got.tolist() == [[4, 5, 6]]
    mine = torch.tensor([[9, 9, 9]])
    assert model(ids, mine)[0] is mine
    assert model(input_ids=ids, position_ids=mine)[0] is mine


def test_without_input_ids_the_forward_runs_unchanged() -> None:
    assert _wrapped()(position_ids=None)[0] is None


def test_a_forward_without_position_ids_is_not_wrapped() -> None:
    class NoPositions(nn.Module):
        def forward(self, input_ids: Any = None) -> Any:
            return input_ids

    assert not install_default_position_ids(NoPositions())


def test_transformers_mask_builders_are_wrapped_once() -> None:
    from transformers import masking_utils

    namespace = {"create_causal_mask": masking_utils.create_causal_mask, "other": len}
    assert full_length_masks(namespace) == ["create_causal_mask"]
    wrapped = namespace["create_causal_mask"]
    assert wrapped is not masking_utils.create_causal_mask
    assert full_length_masks(namespace) == ["create_causal_mask"]
    assert namespace["create_causal_mask"] is wrapped and namespace["other"] is len
