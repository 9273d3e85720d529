"""The one folding rule of every verb's text (hpcodegen/report/terminal.py): break at spaces,
never inside a token; a token longer than a line overflows it; tables widen only when their
words cannot fit."""

from __future__ import annotations

import io

from rich.table import Table

from hpcodegen.report.terminal import console, fold_text

POINTER = "/param_plan/model.layers.0.self_attn/params/k_norm.weight"
LONG = f"examples/qwen3_tp2/codegen_meta.json::{POINTER}:"
TEXT = f"  error   model.missing_param  {LONG} planned parameter " + "word " * 30


def _tokens_whole(out: str, text: str) -> None:
    assert out.split() == text.split()  # every token, in order, none cut


def test_fold_text_never_breaks_a_token() -> None:
    out = fold_text(TEXT, columns=40)
    _tokens_whole(out, TEXT)
    lines = out.splitlines()
    assert f"    {LONG}" in lines  # alone, under the line's own indent plus two
    assert all(len(line) <= 40 for line in lines if LONG not in line)


def test_rich_console_text_folds_the_same_way() -> None:
    buf = io.StringIO()
    console(file=buf, width=40, no_color=True).print(TEXT, markup=False)
    _tokens_whole(buf.getvalue(), TEXT)
    lines = buf.getvalue().splitlines()
    assert f"    {LONG}" in lines
    assert all(len(line.rstrip()) <= 40 for line in lines if LONG not in line)


def _table(*rows: tuple[str, str]) -> Table:
    table = Table(title="t")
    table.add_column("boundary", overflow="fold")
    table.add_column("note", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def _cells(out: str) -> list[str]:
    return [cell.strip() for line in out.splitlines() for cell in line.split("│")[1:-1]]


def test_a_table_keeps_its_words_whole_and_fits_when_they_can() -> None:
    fqn = "model.layers.{0..1}.post_attention_layernorm"
    buf = io.StringIO()
    console(file=buf, width=80, no_color=True).print(_table(
        (fqn, "output: tp P(sum) -> R ==> all_reduce(sum) and a long note " * 2)))
    out = buf.getvalue()
    assert fqn in _cells(out)
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 80
    wide = "hyper_parallel.models.qwen3_moe.adapter.distributed.context_parallel.fn"
    buf = io.StringIO()
    console(file=buf, width=80, no_color=True).print(_table((fqn, f"opaque: {wide}")))
    out = buf.getvalue()
    assert fqn in _cells(out) and wide in out  # wider than 80: the words cannot fit
