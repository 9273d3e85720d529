"""Hostile checkpoints (issue 23): nothing in one runs, nothing wrong is written or loaded.

Each case edits a genuine one-process checkpoint of the tiny llama as an attacker or a
broken disk would; ``export`` and ``resume`` (in this process, no process group) must
refuse it with an exit-2 finding, and a marker file shows whether any planted code ran.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.checkpoint.record import RECORD_NAME, file_sha256, write_record
from hpcodegen.errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from inproc import run as cli  # the CLI's entry point, in this process

pytestmark = [pytest.mark.timeout(400),
              pytest.mark.filterwarnings("ignore::UserWarning")]
REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "configs" / "llama"


class _Planted:
    """Pickles to a call of ``os.system``: what a hostile checkpoint would plant."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _model():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((LLAMA / "config.json").read_text())
    torch.manual_seed(3)
    return config, AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Path:
    """A checkpoint laid out as ``save`` writes it: model tensors, step, groups, record."""
    import torch.distributed.checkpoint as dcp

    config, model = _model()
    ckpt = tmp_path_factory.mktemp("genuine") / "ckpt"
    params = dict(model.named_parameters())
    dcp.save({**{f"model.{n}": p.detach() for n, p in params.items()}, "step": 7},
             checkpoint_id=str(ckpt), no_dist=True)
    write_record(ckpt, {"config": config, "dtype": "float32", "step": 7,
                        "params": {n: {"shape": list(p.shape), "placements": {}}
                                   for n, p in params.items()}, "aliases": {}})
    return ckpt


def _copy(genuine: Path, tmp_path: Path, edit: Callable[[Path], None]) -> Path:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(genuine, ckpt)
    edit(ckpt)
    return ckpt


def _edit_record(ckpt: Path, change: Callable[[dict], None], rehash: bool = True) -> None:
    record = json.loads((ckpt / RECORD_NAME).read_text())
    change(record)
    if rehash:  # a careful attacker keeps the digests consistent
        record["files"] = {n: file_sha256(ckpt / n) for n in record["files"]
                           if (ckpt / n).exists()}
    (ckpt / RECORD_NAME).write_text(json.dumps(record))


def _rehash(ckpt: Path) -> None:
    _edit_record(ckpt, lambda r: None)


def _resume(ckpt: Path) -> int:
    from hpcodegen.checkpoint import ShardLayout, resume
    from hpcodegen.checkpoint.layout import global_shapes

    _, model = _model()
    layout = ShardLayout.from_model(model, global_shapes(model), {})
    return resume(ckpt, model, layout)


def _codes(exc: InputError) -> list[str]:
    return [f.code for f in exc.findings]


def test_the_genuine_checkpoint_resumes_and_exports(genuine, tmp_path) -> None:
    from hpcodegen.checkpoint import export_hf

    assert _resume(genuine) == 7
    out = export_hf(genuine, tmp_path / "hf")
    assert (out / "model.safetensors").is_file()


def _planted_metadata(marker: Path) -> Callable[[Path], None]:
    def edit(ckpt: Path) -> None:
        (ckpt / ".metadata").write_bytes(pickle.dumps(_Planted(marker)))
        _rehash(ckpt)
    return edit


def _planted_step(marker: Path) -> Callable[[Path], None]:
    """A genuine metadata file; the step item's bytes unpickle to a call."""
    def edit(ckpt: Path) -> None:
        import torch.distributed.checkpoint as dcp

        _, model = _model()
        shutil.rmtree(ckpt)
        dcp.save({**{f"model.{n}": p.detach() for n, p in model.named_parameters()},
                  "step": _Planted(marker)}, checkpoint_id=str(ckpt), no_dist=True)
        write_record(ckpt, {"config": json.loads((LLAMA / "config.json").read_text()),
                            "dtype": "float32", "params": {
                                n: {"shape": list(p.shape), "placements": {}}
                                for n, p in model.named_parameters()}})
    return edit


@pytest.mark.parametrize("plant", [_planted_metadata, _planted_step])
def test_planted_code_never_runs(genuine, tmp_path, plant) -> None:
    from hpcodegen.checkpoint import export_hf

    marker = tmp_path / "ran"
    ckpt = _copy(genuine, tmp_path, plant(marker))
    with pytest.raises(InputError) as raised:
        _resume(ckpt)
    assert set(_codes(raised.value)) <= {"checkpoint.metadata", "checkpoint.unreadable"}
    if plant is _planted_metadata:  # export reads no plain items: only the metadata
        with pytest.raises(InputError):
            export_hf(ckpt, tmp_path / "hf")
    assert not marker.exists(), "code planted in the checkpoint ran"


def _drop_everywhere(ckpt: Path) -> None:
    """norm.weight gone from the record and the metadata alike (consistent)."""
    from hpcodegen.checkpoint.metadata import read_metadata

    md = read_metadata(ckpt)
    del md.state_dict_metadata["model.model.norm.weight"]
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))
    _edit_record(ckpt, lambda r: r["params"].pop("model.norm.weight"))


def _flip_a_byte(ckpt: Path) -> None:
    data = next(ckpt.glob("*.distcp"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    data.write_bytes(bytes(raw))


def _chunk_shape(ckpt: Path) -> None:
    """The metadata declares a smaller lm_head, the record follows: a tensor that would
    broadcast or leave garbage is refused, not loaded."""
    from hpcodegen.checkpoint.metadata import read_metadata

    md = read_metadata(ckpt)
    entry = md.state_dict_metadata["model.lm_head.weight"]
    import torch
    entry.size = torch.Size([1, entry.size[1]])
    entry.chunks[0].sizes = torch.Size([1, entry.size[1]])
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))
    _edit_record(ckpt, lambda r: r["params"]["lm_head.weight"].update(shape=[1, 64]))


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "param missing from the record": (
        lambda c: _edit_record(c, lambda r: r["params"].pop("model.norm.weight")),
        "checkpoint.params"),
    "param missing everywhere": (_drop_everywhere, "checkpoint.params"),
    "another dtype in the record": (
        lambda c: _edit_record(c, lambda r: r.update(dtype="float16")), "checkpoint.params"),
    "an integer dtype": (
        lambda c: _edit_record(c, lambda r: r.update(dtype="int64")), "checkpoint.record"),
    "corrupted bytes": (_flip_a_byte, "checkpoint.corrupted"),
    "truncated data file": (
        lambda c: next(c.glob("*.distcp")).write_bytes(b"PK\x03\x04"), "checkpoint.metadata"),
    "a data file replaced by a link": (
        lambda c: (next(c.glob("*.distcp")).unlink(), (c / "__0_0.distcp").symlink_to(
            "/etc/hostname")), "checkpoint.metadata"),
    "a chunk of another shape": (_chunk_shape, "checkpoint.params"),
    "params of the wrong type": (
        lambda c: _edit_record(c, lambda r: r.update(params=["x"])), "checkpoint.record"),
    "a shape of the wrong type": (
        lambda c: _edit_record(c, lambda r: r["params"]["lm_head.weight"].update(
            shape="64")), "checkpoint.record"),
    "no digests": (lambda c: _edit_record(c, lambda r: r.pop("files"), rehash=False),
                   "checkpoint.record"),
    "metadata not a pickle": (lambda c: ((c / ".metadata").write_bytes(b"\x80\x04junk"),
                                         _rehash(c)), "checkpoint.metadata"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_checkpoint_is_refused_by_export_and_resume(genuine, tmp_path,
                                                               case) -> None:
    from hpcodegen.checkpoint import export_hf

    edit, code = CASES[case]
    ckpt = _copy(genuine, tmp_path, edit)
    with pytest.raises(InputError) as raised:
        export_hf(ckpt, tmp_path / "hf")
    assert code in _codes(raised.value), raised.value
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf*"))
    with pytest.raises(InputError):
        _resume(ckpt)


def test_export_cli_reports_a_damaged_checkpoint_as_json_and_keeps_others_files(
        genuine, tmp_path) -> None:
    ckpt = _copy(genuine, tmp_path, _flip_a_byte)
    partial = tmp_path / ".hf.partial"  # someone else's: export must not delete it
    partial.mkdir()
    (partial / "keep").write_text("mine")
    run = cli("export", ckpt, "-o", tmp_path / "hf", "--json", cwd=REPO)  # in this process
    doc = json.loads(run.stdout)
    assert run.returncode == 2 and doc["exit_code"] == 2 and doc["verb"] == "export"
    assert [f["code"] for f in doc["findings"]] == ["checkpoint.corrupted"]
    assert "Traceback" not in run.stderr
    assert (partial / "keep").read_text() == "mine"


def test_load_untrusted_reads_any_dcp_checkpoint_as_data(tmp_path) -> None:
    """torch DCP's own layout (nested state, no hpcodegen record): the genuine one loads
    exactly; a planted item or a tensor of another shape is refused, nothing runs."""
    import torch
    import torch.distributed.checkpoint as dcp

    from hpcodegen.checkpoint import load_untrusted

    weights = {"w": torch.randn(4, 3), "b": torch.arange(5)}
    dcp.save({"model": weights, "extra": {"note": "plain"}},
             checkpoint_id=str(tmp_path / "ok"), no_dist=True)
    state = {"model": {"w": torch.zeros(4, 3), "b": torch.zeros(5, dtype=torch.int64)},
             "extra": {"note": ""}}
    load_untrusted(state, tmp_path / "ok")
    assert torch.equal(state["model"]["w"], weights["w"]) and state["extra"]["note"] == "plain"
    assert torch.equal(state["model"]["b"], weights["b"])
    marker = tmp_path / "ran"
    dcp.save({"model": weights, "extra": {"note": _Planted(marker)}},
             checkpoint_id=str(tmp_path / "evil"), no_dist=True)
    with pytest.raises(InputError):
        load_untrusted(state, tmp_path / "evil")
    with pytest.raises(InputError, match="shape"):
        load_untrusted({"model": {"w": torch.zeros(8, 3)}}, tmp_path / "ok")
    assert not marker.exists()
