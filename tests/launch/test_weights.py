"""Weights from --model-dir: a broken or mismatched safetensors file is named, with the
tensors that differ (in-process on a small module; the rank reports the same message)."""

from __future__ import annotations

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.launch.model import _load_weights

pytestmark = pytest.mark.timeout(60)


def _model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))


def test_garbage_safetensors_names_the_file(tmp_path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(PlanError) as info:
        _load_weights(_model(), tmp_path)
    (f,) = info.value.findings
    assert f.code == "launch.weights_unreadable" and f.file == str(bad)
    assert "not a readable safetensors file" in f.message


def test_shape_mismatch_lists_the_tensors(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"0.weight": torch.zeros(3, 3), "1.bias": torch.zeros(2)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(PlanError) as info:
        _load_weights(_model(), tmp_path)
    (f,) = info.value.findings
    assert f.code == "launch.weights_shape"
    assert "0.weight: file (3, 3), model (8, 4)" in f.message and "1.bias" not in f.message


def test_matching_weights_load(tmp_path) -> None:
    from safetensors.torch import save_file

    source = _model()
    save_file(source.state_dict(), str(tmp_path / "model.safetensors"))
    target = _model()
    assert _load_weights(target, tmp_path) == 1
    assert all((a == b).all() for a, b in zip(source.state_dict().values(),
                                              target.state_dict().values(), strict=True))
