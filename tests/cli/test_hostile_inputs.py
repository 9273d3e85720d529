"""Hostile recipes, configs and paths (issue 23): bounded work, one finding, exit 2,
a ``--json`` document; never a hang, a traceback or an "internal error"."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hpcodegen.cli.app import app, register_verbs
from typer.testing import CliRunner

pytestmark = pytest.mark.timeout(400)
register_verbs()
REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "configs" / "llama"
EXAMPLE = REPO / "examples" / "llama_tp2"

#: about 400 bytes: nine levels of nine aliases, 9^9 (~3.9e8) strings once expanded
ALIAS_BOMB = "a: &a [" + ", ".join(["lol"] * 9) + "]\n" + "".join(
    f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n"
    for p, k in zip("abcdefgh", "bcdefghi", strict=True))


def _run(*args: str | Path) -> tuple[int, dict]:
    res = CliRunner().invoke(app, [*map(str, args), "--json"], catch_exceptions=False)
    return res.exit_code, json.loads(res.stdout)


def _codes(doc: dict) -> list[str]:
    return [f["code"] for f in doc["findings"]]


RECIPES = {
    "alias bomb": (ALIAS_BOMB, "recipe.too_large"),
    "deep flow nesting": ("[" * 50_000 + "]" * 50_000, "recipe.too_large"),
    "deep block nesting": ("- match: x\n  params:\n" + "".join(
        "  " * (i + 2) + f"k{i}:\n" for i in range(200)), "recipe.too_large"),
    "many rules": ("".join(f"- match: m{i}\n" for i in range(3000)), "recipe.too_large"),
    "a long glob": (f"- match: '{'*' * 5000}'\n", "recipe.too_large"),
}


@pytest.mark.parametrize("case", sorted(RECIPES))
def test_a_hostile_recipe_is_refused_at_once(tmp_path, case) -> None:
    text, code = RECIPES[case]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    exit_code, doc = _run("generate", "--model", LLAMA, "--tp", "2", "--recipe", recipe,
                          "-o", tmp_path / "out")
    assert (exit_code, _codes(doc)) == (2, [code]), doc
    assert not (tmp_path / "out").exists()


def test_a_recipe_fifo_is_refused_without_opening_it(tmp_path) -> None:
    fifo = tmp_path / "r.yaml"
    os.mkfifo(fifo)
    exit_code, doc = _run("generate", "--model", LLAMA, "--tp", "2", "--recipe", fifo,
                          "-o", tmp_path / "out")
    assert (exit_code, _codes(doc)) == (2, ["recipe.unreadable"])


def test_many_double_star_globs_match_in_bounded_time() -> None:
    from hpcodegen.generate.sources.globs import fqn_matches

    glob = ".".join(["**"] * 200 + ["z"])
    assert not fqn_matches(glob, ".".join("abcdefghijklmnopqrstuvwxy"))
    assert fqn_matches(glob, "a.b.z")


CONFIGS = {
    "10^5 layers": {"num_hidden_layers": 100_000},
    "layers as a string": {"num_hidden_layers": "2"},
    "a float size": {"hidden_size": 64.0},
    "a boolean head count": {"num_attention_heads": True},
    "a negative vocabulary": {"vocab_size": -5},
    "an absurd vocabulary": {"vocab_size": 10**15},
    "a size as a list of strings": {"intermediate_size": ["a"]},
    "a list model_type": {"model_type": ["llama"]},
    "architectures of numbers": {"architectures": [5]},
    "bias as a string": {"attention_bias": "no"},
    "GPT-2 style layer count": {"n_layer": 10**6},
    "a deep sub-config count": {"text_config": {"vision": {"num_layers": 10**7}}},
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_a_hostile_config_is_refused_before_anything_is_built(tmp_path, case,
                                                               monkeypatch) -> None:
    import hpcodegen.hf as hf

    config = json.loads((LLAMA / "config.json").read_text()) | CONFIGS[case]
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(hf, "build_meta_model", lambda *a, **k: pytest.fail("built"))
    exit_code, doc = _run("generate", "--model", tmp_path, "--tp", "2", "-o",
                          tmp_path / "out")
    assert (exit_code, _codes(doc)[:1]) == (2, ["config.bad_value"]), doc
    exit_code, doc = _run("verify", EXAMPLE, "--hf-config", tmp_path)
    assert exit_code == 2 and "config.bad_value" in {
        f["code"] for a in doc["artifacts"] for c in a["checks"].values()
        for f in c["findings"]}


LONG = "x" * 5000


@pytest.mark.parametrize("args", [
    ("verify", LONG), ("verify", EXAMPLE, "--hf-config", f"org/{LONG}"),
    ("inspect-plan", LONG), ("generate", "--model", f"org/{LONG}", "--tp", "2", "-o", "o"),
    ("generate", "--model", LONG, "--tp", "2", "-o", "o"), ("export", LONG, "-o", "o"),
    ("launch", LONG, "--nproc", "2"),
    ("launch", EXAMPLE, "--nproc", "2", "--model-dir", f"org/{LONG}", "--dry-run"),
    ("generate", "--model", LLAMA, "--tp", "2", "-o", f"{LONG}/x"),
], ids=lambda a: " ".join(str(x)[:12] for x in a))
def test_a_path_the_os_refuses_is_bad_input(tmp_path, args, monkeypatch) -> None:
    """A name too long for the OS (a 5,000-character Hub id or path): exit 2, a finding."""
    monkeypatch.chdir(tmp_path)
    exit_code, doc = _run(*args)
    assert exit_code == 2 and doc["exit_code"] == 2, doc
    codes = _codes(doc) or [f["code"] for a in doc.get("artifacts", [])
                            for c in a["checks"].values() for f in c["findings"]]
    assert codes and "internal.error" not in codes
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["", ".", "/"])
def test_odd_out_targets_never_replace_a_directory(tmp_path, out, monkeypatch) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    exit_code, doc = _run("generate", "--model", LLAMA, "--tp", "2", "-o", out)
    assert exit_code == 2 and _codes(doc) == ["generate.out_not_bundle"], doc
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
