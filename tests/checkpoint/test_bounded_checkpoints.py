"""Bounded work on hostile checkpoints (issue 34): each file is tiny or sparse and costs
an honest reader almost nothing, but claims work without end (a chunk list shared through
the pickle memo by every key, a step item nested through one shared list, a 1 TiB file,
a 2^30-row embedding). Each is refused with an exit-2 finding after work bounded by
the limits of :mod:`hpcodegen.checkpoint.metadata` and :mod:`hpcodegen.checkpoint.dcp_safe`
(counted here, never timed); a generous pytest timeout catches a hang. The CLI runs
(export, launch's pre-start refusal) go through its entry point in this process
(``tests/cli/inproc.py``): the same code and exit codes without a fresh interpreter.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcodegen.checkpoint.record import RECORD_NAME, file_sha256, write_record
from hpcodegen.errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from inproc import run as cli  # the CLI's entry point, in this process

pytestmark = [pytest.mark.timeout(400), pytest.mark.filterwarnings("ignore::UserWarning")]
REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "configs" / "llama"


def _model():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((LLAMA / "config.json").read_text())
    torch.manual_seed(3)
    return config, AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Path:
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


def _copy(genuine: Path, tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(genuine, ckpt)
    return ckpt


def _rehash(ckpt: Path, extra: tuple[str, ...] = ()) -> None:
    record = json.loads((ckpt / RECORD_NAME).read_text())
    names = set(record["files"]) | set(extra)
    record["files"] = {n: file_sha256(ckpt / n) for n in sorted(names)}
    (ckpt / RECORD_NAME).write_text(json.dumps(record))


def _resume(ckpt: Path) -> int:
    from hpcodegen.checkpoint import ShardLayout, resume
    from hpcodegen.checkpoint.layout import global_shapes

    _, model = _model()
    layout = ShardLayout.from_model(model, global_shapes(model), {})
    return resume(ckpt, model, layout)


def _codes(exc: InputError) -> list[str]:
    return [f.code for f in exc.findings]


def _export_cli(ckpt: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return cli("export", ckpt, "-o", out, "--json", cwd=REPO)


def _shared_chunks_metadata(n_keys: int, n_chunks: int):
    """DCP metadata of allowed classes whose keys all name one chunk list."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    shared = [ChunkStorageMetadata(offsets=torch.Size([i]), sizes=torch.Size([1]))
              for i in range(n_chunks)]
    state = {f"model.k{i}": TensorStorageMetadata(TensorProperties(dtype=torch.float32),
                                                  torch.Size([n_chunks]), shared)
             for i in range(n_keys)}
    return Metadata(state_dict_metadata=state, storage_data={})


def test_a_chunk_list_shared_by_every_key_is_refused_by_its_budget(genuine, tmp_path,
                                                                    monkeypatch) -> None:
    from hpcodegen.checkpoint import metadata as md_mod

    ckpt = _copy(genuine, tmp_path)
    raw = pickle.dumps(_shared_chunks_metadata(200, md_mod.MAX_CHUNKS))
    assert len(raw) < 4 * 2**20  # a few MiB: the pickle memo stores the list once
    (ckpt / ".metadata").write_bytes(raw)
    _rehash(ckpt)
    walked = []  # count the cover checks: the shared list is checked once
    real = md_mod.check_exact_cover
    monkeypatch.setattr(md_mod, "check_exact_cover",
                        lambda *a: (walked.append(len(a[2])), real(*a))[1])
    with pytest.raises(InputError) as raised:
        md_mod.read_metadata(ckpt)
    assert _codes(raised.value) == ["checkpoint.limit"]
    assert "shared lists count at every use" in raised.value.findings[0].message
    assert walked == [md_mod.MAX_CHUNKS]
    run = _export_cli(ckpt, tmp_path / "hf")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert [f["code"] for f in json.loads(run.stdout)["findings"]] == ["checkpoint.limit"]
    assert not (tmp_path / "hf").exists()


def test_the_cover_check_of_the_largest_chunk_list_is_linear() -> None:
    """65,536 chunks of one tensor: each chunk and dim looked up in a map of the next cut
    (no scan of the cut list per chunk, which made this quadratic); a non-tiling set of
    as many chunks is still refused."""
    import inspect

    from hpcodegen.checkpoint import metadata as md_mod

    assert ".index(" not in inspect.getsource(md_mod.check_exact_cover)
    n = md_mod.MAX_CHUNKS
    md_mod.check_exact_cover("k", (n,), [((i,), (1,)) for i in range(n)])
    grid = [((r, c), (1, 1)) for r in range(2) for c in range(64)]
    merged = [b for b in grid if b[0] not in ((0, 0), (0, 2))]
    merged += [((0, 0), (1, 2))]  # overlaps (0, 1), leaves (0, 2) empty
    with pytest.raises(ValueError, match="tile"):
        md_mod.check_exact_cover("k", (2, 64), merged)


def _nested_step(depth: int, width: int) -> tuple:
    """One shared tuple nested ``depth`` deep: width**depth values in a few KiB (the pickle
    memo stores each level once; a tuple, so DCP's save stores it as one item)."""
    inner: tuple = (0,) * width
    for _ in range(depth - 1):
        inner = (inner,) * width
    return inner


def test_a_step_of_one_shared_list_nested_ten_deep_is_refused_by_type(genuine, tmp_path
                                                                      ) -> None:
    """A 2 KB step item reaching 10^10 values: refused for its type, nothing walked."""
    import torch.distributed.checkpoint as dcp

    from hpcodegen.checkpoint.dcp_safe import plain_problem

    config, model = _model()
    ckpt = tmp_path / "ckpt"
    params = dict(model.named_parameters())
    dcp.save({**{f"model.{n}": p.detach() for n, p in params.items()},
              "step": _nested_step(10, 10)}, checkpoint_id=str(ckpt), no_dist=True)
    write_record(ckpt, {"config": config, "dtype": "float32", "step": 7,
                        "params": {n: {"shape": list(p.shape), "placements": {}}
                                   for n, p in params.items()}, "aliases": {}})
    with pytest.raises(InputError) as raised:
        _resume(ckpt)
    assert "step: a tuple, expected int" in str(raised.value)
    assert (ckpt / "__0_0.distcp").stat().st_size < 2**20
    # where no type is known (load_untrusted of a container), the walk has a budget
    assert "more than" in plain_problem(_nested_step(10, 10))
    assert plain_problem({"a": [1, 2.0, "x", None, {"b": True}]}) is None


def test_load_untrusted_bounds_a_shared_nested_item(tmp_path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from hpcodegen.checkpoint import load_untrusted

    dcp.save({"w": torch.ones(2), "extra": _nested_step(10, 10)},
             checkpoint_id=str(tmp_path / "c"), no_dist=True)
    with pytest.raises(InputError, match="more than"):
        load_untrusted({"w": torch.zeros(2), "extra": ()}, tmp_path / "c")


def test_a_recorded_sparse_file_nothing_uses_is_refused_before_hashing(
        genuine, tmp_path, monkeypatch) -> None:
    from hpcodegen.checkpoint import integrity, record

    ckpt = _copy(genuine, tmp_path)
    big = ckpt / "__9_0.distcp"
    with open(big, "wb") as fh:
        fh.truncate(2**40)  # 1 TiB, no block on disk
    rec = json.loads((ckpt / RECORD_NAME).read_text())
    rec["files"]["__9_0.distcp"] = "0" * 64  # an attacker need not hash it either
    (ckpt / RECORD_NAME).write_text(json.dumps(rec))
    hashed = []
    monkeypatch.setattr(record, "file_sha256", lambda p: hashed.append(p) or "0" * 64)
    with pytest.raises(InputError) as raised:
        integrity.open_checkpoint(ckpt)
    assert _codes(raised.value) == ["checkpoint.unused_file"] and hashed == []
    run = _export_cli(ckpt, tmp_path / "hf")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert [f["code"] for f in json.loads(run.stdout)["findings"]] == ["checkpoint.unused_file"]


def test_a_used_data_file_grown_sparse_is_refused_before_hashing(genuine, tmp_path,
                                                                 monkeypatch) -> None:
    from hpcodegen.checkpoint import integrity, record

    ckpt = _copy(genuine, tmp_path)
    data = next(ckpt.glob("*.distcp"))
    with open(data, "r+b") as fh:
        fh.truncate(2**40)
    hashed = []
    monkeypatch.setattr(record, "file_sha256", lambda p: hashed.append(p) or "0" * 64)
    with pytest.raises(InputError) as raised:
        integrity.open_checkpoint(ckpt)
    # the metadata's byte ranges end long before: the size is refused first
    assert _codes(raised.value) == ["checkpoint.metadata"] and hashed == []
    assert "its entries end at byte" in raised.value.findings[0].message


def test_a_claimed_huge_vocabulary_is_refused_before_anything_is_allocated(
        genuine, tmp_path, monkeypatch) -> None:
    """Record, metadata and config all claim a 2^30-row embedding; the byte range holds the
    genuine few KiB. Refused by the metadata's own byte-range check: torch.empty is never
    asked for 256 GiB."""
    import torch

    from hpcodegen.checkpoint import export_hf
    from hpcodegen.checkpoint.metadata import read_metadata

    ckpt = _copy(genuine, tmp_path)
    md = read_metadata(ckpt)
    vocab = 2**30
    for key in ("model.model.embed_tokens.weight", "model.lm_head.weight"):
        entry = md.state_dict_metadata[key]
        entry.size = torch.Size([vocab, entry.size[1]])
        entry.chunks[0].sizes = torch.Size([vocab, entry.size[1]])
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))
    rec = json.loads((ckpt / RECORD_NAME).read_text())
    rec["config"]["vocab_size"] = vocab
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in rec["params"]:
            rec["params"][name]["shape"][0] = vocab
    (ckpt / RECORD_NAME).write_text(json.dumps(rec))
    _rehash(ckpt)
    asked = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: (asked.append(a), real_empty(
        *a, **k))[1])
    with pytest.raises(InputError) as raised:
        export_hf(ckpt, tmp_path / "hf")
    assert _codes(raised.value) == ["checkpoint.metadata"]
    assert "needs" in raised.value.findings[0].message
    assert not any(a and isinstance(a[0], (tuple, list, torch.Size)) and a[0]
                   and a[0][0] == vocab for a in asked)
    assert not (tmp_path / "hf").exists()
    with pytest.raises(InputError):
        _resume(ckpt)


def test_the_genuine_checkpoint_still_exports_and_resumes(genuine, tmp_path) -> None:
    from hpcodegen.checkpoint import export_hf

    assert _resume(genuine) == 7
    assert (export_hf(genuine, tmp_path / "hf") / "model.safetensors").is_file()


def test_launch_resume_refuses_the_shared_chunk_metadata_before_any_rank(genuine,
                                                                         tmp_path) -> None:
    """The pre-start check of ``launch --resume --timeout 300`` reads the hostile metadata:
    one exit-2 finding, no rank started, well inside its timeout (the budget, not a clock,
    stops it: the timeout would say launch.timeout)."""
    from hpcodegen.checkpoint import metadata as md_mod

    ckpt = _copy(genuine, tmp_path)
    (ckpt / ".metadata").write_bytes(pickle.dumps(_shared_chunks_metadata(
        200, md_mod.MAX_CHUNKS)))
    _rehash(ckpt)
    proc = cli("launch", REPO / "examples" / "llama_tp2", "--nproc", "2", "--model-dir",
               LLAMA, "--resume", ckpt, "--steps", "1", "--timeout", "300", "--log-dir",
               tmp_path / "logs", "--json", cwd=REPO)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2, doc
    assert [f["code"] for f in doc["findings"]] == ["checkpoint.limit"]
    assert not (tmp_path / "logs").exists()


def test_a_step_of_five_thousand_digits_is_one_finding(tmp_path) -> None:
    import torch.distributed.checkpoint as dcp

    config, model = _model()
    ckpt = tmp_path / "ckpt"
    params = dict(model.named_parameters())
    dcp.save({**{f"model.{n}": p.detach() for n, p in params.items()}, "step": 10**5000},
             checkpoint_id=str(ckpt), no_dist=True)
    write_record(ckpt, {"config": config, "dtype": "float32", "step": 7,
                        "params": {n: {"shape": list(p.shape), "placements": {}}
                                   for n, p in params.items()}, "aliases": {}})
    with pytest.raises(InputError) as raised:
        _resume(ckpt)
    assert _codes(raised.value) in (["checkpoint.step"], ["checkpoint.unreadable"])
    assert len(str(raised.value)) < 2000  # the number is not printed


def test_chunk_objects_shared_by_many_lists_are_checked_once(genuine, tmp_path,
                                                             monkeypatch) -> None:
    """Each key its own list, every list naming the same 64-dim chunk objects through the
    memo: each chunk object's dims are read once, the reaches count against the budget."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    from hpcodegen.checkpoint import metadata as md_mod

    dims, n = 64, 4096
    size = torch.Size([n] + [1] * (dims - 1))
    shared = [ChunkStorageMetadata(offsets=torch.Size([i] + [0] * (dims - 1)),
                                   sizes=torch.Size([1] * dims)) for i in range(n)]
    state = {f"model.k{i}": TensorStorageMetadata(TensorProperties(dtype=torch.float32),
                                                  size, list(shared)) for i in range(1100)}
    ckpt = _copy(genuine, tmp_path)
    (ckpt / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata=state,
                                                           storage_data={})))
    read, walked = [], []  # both counted in one read of the metadata
    real = md_mod._ints
    monkeypatch.setattr(md_mod, "_ints", lambda *a: (read.append(a[1]), real(*a))[1])
    real_cover = md_mod.check_exact_cover
    monkeypatch.setattr(md_mod, "check_exact_cover",
                        lambda *a: (walked.append(1), real_cover(*a))[1])
    with pytest.raises(InputError) as raised:
        md_mod.read_metadata(ckpt)
    assert _codes(raised.value) == ["checkpoint.limit"]
    # offsets and sizes of each distinct chunk object, once (besides each key's own size)
    assert len([w for w in read if "chunk" in w]) == 2 * n
    assert walked == [1]  # and the tiling of the one sequence of chunk objects, once
