"""Phase D ties what the unsharded model ties, not what its config's flag suggests."""

from __future__ import annotations

from types import SimpleNamespace

from torch import nn

from hpcodegen.plan.codec import plan_from_meta
from hpcodegen.plan.types import Plan
from hpcodegen.runtime.tied import tied_pairs


class _Decoder(nn.Module):
    def __init__(self, tie: bool) -> None:
        super().__init__()
        self.config = SimpleNamespace(tie_word_embeddings=True)
        self.embed_tokens = nn.Embedding(8, 4)
        self.lm_head = nn.Linear(4, 8, bias=False)
        if tie:
            self.lm_head.weight = self.embed_tokens.weight


def test_untied_model_with_tie_word_embeddings_is_not_tied() -> None:
    # BigBird-Pegasus' causal LM: the flag is set, the class never ties the two
    assert tied_pairs(_Decoder(tie=False), plan_from_meta({"tied_pairs": []})) == []


def test_tied_model_without_explicit_pairs_keeps_its_tie() -> None:
    assert tied_pairs(_Decoder(tie=True), Plan()) == [("embed_tokens.weight", "lm_head.weight")]


def test_explicit_pairs_win() -> None:
    meta = {"tied_pairs": [["lm_head.weight", "embed_tokens.weight"]]}
    assert tied_pairs(_Decoder(tie=False), plan_from_meta(meta)) == [
        ("lm_head.weight", "embed_tokens.weight")]
