"""The one source walk for ``self.<child>(<parameter>)`` calls
(:func:`hpcodegen.generate.seeds.seeds.self_calls_on_params`) and the two readings of it:
the children applied to a forward's first input, and an attention's inputs by child."""

from __future__ import annotations

from hpcodegen.generate.seeds.attention_seeds import forward_inputs_read
from hpcodegen.generate.seeds.seeds import input_readers, self_calls_on_params

SOURCE = '''
    def forward(self, v, k, q, mask=None):
        out = self.Wo(self.Wq(q) * self.Wk(k) + self.Wv(v))
        return self.norm(out) + self.Wq(k)

    def helper(self, x):
        return self.proj(x) + self.other(y)
'''


def test_each_call_on_an_own_parameter_with_its_position() -> None:
    calls = self_calls_on_params(SOURCE)
    assert sorted(set(calls)) == [("Wk", "k", 1), ("Wq", "k", 1), ("Wq", "q", 2),
                                  ("Wv", "v", 0), ("proj", "x", 0)]
    # Wo and norm read a local, other a name no function takes: none of them is a call here
    assert not {c for c, _p, _i in calls} & {"Wo", "norm", "other"}


def test_first_input_readers_are_position_zero_of_any_method() -> None:
    assert input_readers(SOURCE) == {"Wv", "proj"}


def test_an_attentions_inputs_keep_each_childs_first_call_in_walk_order() -> None:
    # ast.walk is breadth first: the return's Wq(k) is shallower than the first line's Wq(q)
    assert forward_inputs_read(SOURCE) == {"Wq": "k", "Wv": "v", "Wk": "k", "proj": "x"}


def test_unparsable_source_has_no_calls() -> None:
    assert self_calls_on_params("def forward(self, x) return") == []
    assert input_readers("not python (") == set()
    assert forward_inputs_read("not python (") == {}
