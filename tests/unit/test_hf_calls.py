"""``no_cache_kwargs``: one-shot calls (training steps, parity, dry runs) go without a KV cache."""

from hpcodegen.hf import no_cache_kwargs


class _CausalLM:
    def forward(self, input_ids, attention_mask=None, use_cache=None):
        return input_ids


class _Encoder:
    def forward(self, input_ids, attention_mask=None):
        return input_ids


class _Opaque:
    forward = staticmethod(len)  # a builtin: no inspectable signature


def test_use_cache_false_where_the_forward_takes_it() -> None:
    assert no_cache_kwargs(_CausalLM()) == {"use_cache": False}


def test_nothing_passed_to_a_forward_without_use_cache() -> None:
    assert no_cache_kwargs(_Encoder()) == {}
    assert no_cache_kwargs(_Opaque()) == {}
    assert no_cache_kwargs(object()) == {}
