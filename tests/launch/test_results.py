"""Rank result files and the verdict drawn from them (pure: no processes)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from hpcodegen.launch.launcher.display import rank_table
from hpcodegen.launch.launcher.options import LaunchOptions
from hpcodegen.launch.launcher.supervise import JobOutcome
from hpcodegen.launch.launcher.verdict import verdict
from hpcodegen.launch.rank.smoke import _failure
from hpcodegen.launch.results import RankRecord, first_error, read_records, write_record

OPTS = LaunchOptions(artifact=Path("art"), nproc=2, timeout=5.0)


def test_records_round_trip_and_skip_garbage(tmp_path):
    write_record(tmp_path, RankRecord(rank=1, status="ok", losses=[2.5, 2.0],
                                      parity={"logits_max_diff": 1e-7}))
    (tmp_path / "rank7.json").write_text("{half a rec")
    records = read_records(tmp_path)
    assert list(records) == [1]
    assert records[1].losses == [2.5, 2.0] and records[1].done
    assert not list(tmp_path.glob(".rank*.tmp")), "no temp file left behind"


def test_first_error_is_the_earliest():
    late = RankRecord(rank=0, status="error", error="RuntimeError: peer closed")
    early = RankRecord(rank=1, status="error", error="ValueError: root cause")
    late.updated, early.updated = 20.0, 10.0
    assert first_error({0: late, 1: early}).rank == 1
    assert first_error({0: RankRecord(rank=0, status="ok")}) is None


def _outcome(*records: RankRecord, **kw) -> JobOutcome:
    return JobOutcome(records={r.rank: r for r in records}, returncode=1, **kw)


def test_verdict_ok_only_when_every_rank_is_ok(tmp_path):
    ok = [RankRecord(rank=r, status="ok", parity={"logits_max_diff": 1e-7,
                                                   "grad_max_diff": 2e-7, "tolerance": 1e-5})
          for r in range(2)]
    code, message = verdict(_outcome(*ok), OPTS, None, tmp_path)
    assert code == 0 and "all 2 ranks ok" in message and "2.00e-07" in message
    code, message = verdict(_outcome(ok[0]), OPTS, None, tmp_path)
    assert code == 1 and message.startswith("rank 1 ended without a result")


def test_verdict_names_the_failing_rank(tmp_path):
    bad = RankRecord(rank=1, status="error", error="ValueError: boom")
    outcome = _outcome(RankRecord(rank=0, phase="forward"), bad, ended_early=True)
    code, message = verdict(outcome, OPTS, None, tmp_path)
    assert (code, message) == (1, "rank 1 failed: ValueError: boom")
    assert outcome.records[0].status == "ended"


def test_verdict_timeout_and_check_failure(tmp_path):
    code, message = verdict(_outcome(RankRecord(rank=0, phase="step 2/3"), timed_out=True),
                            OPTS, None, tmp_path)
    assert code == 1 and message.startswith("timed out after 5 s")
    assert "0 (step 2/3)" in message and "1 (" not in message
    fail = RankRecord(rank=0, status="fail", error="parity grad max diff 1e-3 > tolerance")
    code, message = verdict(_outcome(fail, RankRecord(rank=1, status="ok")), OPTS, None,
                            tmp_path)
    assert code == 1 and message.startswith("rank 0 check failed: parity grad")


def test_parity_failure_names_the_quantity():
    assert _failure({"logits_max_diff": 1e-7, "grad_max_diff": 1e-6}, 1e-5) is None
    text = _failure({"logits_max_diff": 1e-7, "grad_max_diff": 3e-4,
                     "worst_grad": "lm_head.weight"}, 1e-5)
    assert text == "parity grad max diff 3.000e-04 at lm_head.weight > tolerance 1e-05"
    assert "nan" in _failure({"logits_max_diff": float("nan")}, 1e-5)
    assert "shape" in _failure({"mismatched_params": ["a.weight"]}, 1e-5)


def test_table_columns():
    console = Console(width=200, record=True)
    recs = {0: RankRecord(rank=0, device="cpu", local_param_bytes=230_000, forward_ms=12.5,
                          status="ok", parity={"logits_max_diff": 2.4e-7})}
    console.print(rank_table(recs, 2, "t"))
    text = console.export_text()
    for cell in ("rank", "local params", "forward", "logits diff", "224.6 KiB", "12.5 ms",
                 "2.40e-07", "ok", "starting"):
        assert cell in text
    console.print(rank_table(recs, 2, "t", script=True))
    assert "logits diff" not in console.export_text()


def test_loss_lines_align_sharded_and_reference():
    from hpcodegen.launch.launcher.display import loss_lines

    recs = {1: RankRecord(rank=1, losses=[2.0, 1.5], ref_losses=[2.0, 1.25]),
            0: RankRecord(rank=0, losses=[2.0, 1.5], ref_losses=[2.0, 1.25])}
    assert loss_lines(recs) == ["loss per step (rank 0): 2.000000 1.500000",
                                "unsharded reference:    2.000000 1.250000"]
    assert loss_lines({0: RankRecord(rank=0)}) == []


def test_the_synthetic_batch_indexes_a_composite_configs_text_vocab():
    """Fuyu's config keeps vocab_size in text_config only: launch read it on the top level
    and every rank died with AttributeError before the forward."""
    import json

    from hpcodegen.hf import load_transformers_config
    from hpcodegen.launch.rank.smoke import vocab_size_of

    fuyu = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "fuyu"
    config = load_transformers_config(json.loads((fuyu / "config.json").read_text()))
    assert vocab_size_of(config) == config.text_config.vocab_size
    assert vocab_size_of(config.text_config) == config.text_config.vocab_size


def test_the_vocab_parallel_loss_takes_the_heads_own_width():
    """The vocab-sharded logits are slices of the head's output, whose width can differ from
    config.vocab_size (a head sized from its embedding): the loss must place each rank's
    slice by the head's global rows (the layout's pre-install shape), tied or not."""
    from torch import nn

    from hpcodegen.checkpoint.layout import ShardLayout
    from hpcodegen.launch.rank.model import BuiltModel
    from hpcodegen.launch.rank.smoke import head_vocab

    class LM(nn.Module):
        def __init__(self, tied: bool):
            super().__init__()
            self.embed = nn.Embedding(260, 4)
            self.lm_head = nn.Linear(4, 130, bias=False)  # this rank's half of 260
            if tied:
                self.lm_head.weight = self.embed.weight

        def get_output_embeddings(self):
            return self.lm_head

    config = type("Config", (), {"vocab_size": 250})()
    for tied in (False, True):
        model = LM(tied)
        layout = ShardLayout.from_model(model, {"embed.weight": (260, 4),
                                                "lm_head.weight": (260, 4)}, None)
        assert head_vocab(BuiltModel(model, config, {}, "", layout)) == 260
    model = LM(False)
    assert head_vocab(BuiltModel(model, config, {}, "", None)) == 250


def test_the_table_reports_peak_rss_and_an_unexercised_window() -> None:
    from hpcodegen.launch.launcher.display import batch_lines
    from hpcodegen.launch.results import RankRecord
    from hpcodegen.parity.lengths import bounded_length

    shape = bounded_length(32, multiple=2, window=4096)
    rec = RankRecord(rank=0, world_size=2, status="ok", peak_rss_bytes=300 * 2**20,
                     batch={"rows": 2, **shape.to_json()})
    other = RankRecord(rank=1, world_size=2, status="ok", peak_rss_bytes=310 * 2**20)
    lines = batch_lines({0: rec, 1: other})
    assert lines[0] == "peak resident memory: 310.0 MiB (rank 1, the largest of 2)"
    assert lines[1] == "smoke batch: 2 x 32 tokens"
    assert lines[2].startswith("note: sliding window 4096 not exercised")
    short = bounded_length(32, multiple=2, window=3)
    rec.batch = {"rows": 2, **short.to_json()}
    assert batch_lines({0: rec})[1:] == [
        "smoke batch: 2 x 32 tokens (sliding window 3 exercised)"]
    assert batch_lines({0: RankRecord(rank=0)}) == []
