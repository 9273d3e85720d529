"""The smoke batch stays small whatever the config says (pure: no torch, no ranks).

A sliding window is exercised (the sequence made longer than the window) only where that
fits under the bound; otherwise the length stays the usual one and the note says why.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcodegen.launch.rank.model import smoke_length, synthetic_length
from hpcodegen.parity.lengths import (
    MAX_SMOKE_TOKENS,
    bounded_length,
    max_positions_of,
    sliding_window_of,
)


@pytest.mark.parametrize("window", [4096, 32768, 131072, 10**9])
def test_a_realistic_window_leaves_the_batch_at_its_usual_length(window: int) -> None:
    for world in (1, 2, 3, 4, 8):
        got = bounded_length(32 if 32 % world == 0 else 8 * world, multiple=world,
                             window=window, max_positions=window * 2)
        assert got.length <= MAX_SMOKE_TOKENS and got.length % world == 0
        assert not got.window_exercised
        assert got.note is not None and str(window) in got.note and str(got.cap) in got.note
        assert synthetic_length(world, window) == got.length


def test_a_short_window_is_exercised_up_to_eight_windows() -> None:
    got = bounded_length(32, multiple=2, window=3)
    assert got.length == 32 and got.window_exercised and got.note is None  # 32 > 8 * 3
    got = bounded_length(32, multiple=4, window=20)
    assert got.length == 256 and got.window_exercised  # the first doubling past 8 windows
    got = bounded_length(32, multiple=4, window=200)  # past the bound at 8 windows
    assert got.length == MAX_SMOKE_TOKENS and got.window_exercised


def test_max_positions_bound_the_length() -> None:
    got = bounded_length(32, multiple=2, window=4096, max_positions=128)
    assert got.length == 32 and got.cap == 128 and not got.window_exercised
    assert bounded_length(32, multiple=2, window=40, max_positions=128).length == 128
    assert bounded_length(32, multiple=4, max_positions=10).length == 8  # a multiple of 4
    assert bounded_length(96, multiple=3, max_positions=10**6).length == 96


def test_the_config_is_read_at_the_top_level_or_its_text_part() -> None:
    text = {"text_config": {"sliding_window": 4096, "max_position_embeddings": 256}}
    assert sliding_window_of(text) == 4096 and max_positions_of(text) == 256
    assert sliding_window_of({"sliding_window": None}) is None
    assert sliding_window_of({"sliding_window": True}) is None  # a flag, not a size
    assert max_positions_of({"n_positions": 64}) == 64


def test_the_rank_reads_the_transformers_config() -> None:
    from transformers import MistralConfig, Qwen2Config

    shape = smoke_length(2, MistralConfig(max_position_embeddings=32768))
    assert (shape.length, shape.window, shape.window_exercised) == (32, 4096, False)
    assert smoke_length(4, Qwen2Config(use_sliding_window=True, sliding_window=16)
                        ).length == 256


def test_the_length_rule_imports_no_torch() -> None:
    code = ("import sys; from hpcodegen.parity.lengths import bounded_length; "
            "bounded_length(32, window=4096); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.strip() == "False"
