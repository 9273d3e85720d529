"""``launch --check-parity`` on tiny models whose sliding window is their family's default.

The smoke batch once doubled until it held 8 windows: with a 4096-token window that was
65,536 tokens, and each rank of a 2-layer, 64-wide model grew past 8 GiB. Here the window
is the family's default and the max positions are left large, so only the smoke bound
(:mod:`hpcodegen.parity.lengths`) keeps the batch small: parity holds, each rank's peak
resident memory (its own high-water mark, in its record) stays under 1 GiB, and the report
says the window was not exercised. A second case has activations that cannot fit: refused
with the figures before anything is built.

One family (mistral) runs through a real launch: the launcher's path, and a fresh rank
process's own peak. The other families run launch's rank job on the session's kept gloo
ranks (``launch_gloo``), in one call: same job, same figures checked, each rank's peak
reset before its case (``fresh_peak_cases``) so it is the case's own on top of the imports
a launched rank holds too, never below a fresh rank's figure. The refusal (its figures,
not its launching: that is ``test_memory_refusal.py``'s real launch) runs there too, and
the launcher's own verdict turns its records into the exit code and the line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_gloo import fresh_peak_cases, gloo_launch, rank_env
from launch_helpers import check_in_process, run_cli

pytestmark = pytest.mark.gloo

GIB = 2**30
#: (model_type, class, config overrides): each family's own default window is kept
FAMILIES = [
    ("mistral", "MistralForCausalLM", {}),
    ("gemma2", "Gemma2ForCausalLM", {}),
    ("qwen2", "Qwen2ForCausalLM", {"use_sliding_window": True, "max_window_layers": 0}),
    ("gemma3_text", "Gemma3ForCausalLM", {}),
    ("exaone4", "Exaone4ForCausalLM", {}),
]


def _artifact(base: Path, model_type: str, cls: str, extra: dict) -> tuple[Path, Path, int]:
    """A tiny config of the family (its default window kept, 1M max positions), and its
    tp 2 artifact; returns the dirs and the window."""
    import transformers

    from hpcodegen.families.tiny import tiny_config
    from hpcodegen.generate.api import GenerateArgs, run_generate

    config = tiny_config(model_type, cls) | extra | {"max_position_embeddings": 2**20}
    window = transformers.AutoConfig.for_model(model_type, **extra).sliding_window
    assert isinstance(window, int) and window >= 4096, (model_type, window)
    config["sliding_window"] = window
    (base / "cfg").mkdir(parents=True)
    (base / "cfg" / "config.json").write_text(json.dumps(config))
    assert run_generate(GenerateArgs(base / "cfg", 2, base / "art", verbosity=-1)) == 0
    check_in_process(base / "art", base / "cfg")  # what launch checks first (its verdict read)
    return base / "art", base / "cfg", window


def _assert_small_batch(case: str, doc: dict, window: int) -> None:
    """A ``--check-parity`` document of a default-window family: exact, the batch bounded
    and said so, each rank's peak under 1 GiB; a failure names the case."""
    for rank in doc["ranks"]:
        assert rank["status"] == "ok", (case, rank["status"], rank["error"])
        assert rank["parity"]["logits_max_diff"] <= 1e-5, (case, rank["parity"])
        assert rank["parity"]["grad_max_diff"] <= 1e-5, (case, rank["parity"])
        batch = rank["batch"]
        assert batch["window"] == window and batch["length"] <= 512, (case, batch)
        assert batch["window_exercised"] is False and str(window) in batch["note"], \
            (case, batch)
        assert 0 < rank["peak_rss_bytes"] < GIB, (case, rank["peak_rss_bytes"],
                                                  rank.get("rss_at_start_bytes"))


@pytest.mark.timeout(400)
def test_a_default_window_keeps_the_smoke_batch_small_through_launch(tmp_path: Path) -> None:
    model_type, cls, extra = FAMILIES[0]
    artifact, config, window = _artifact(tmp_path, model_type, cls, extra)
    run = run_cli(artifact, "--nproc", "2", "--device", "cpu", "--model-dir", config,
                  "--check-parity", "--json", timeout=300)
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _assert_small_batch(model_type, run.json(), window)


@pytest.fixture(scope="module")
def on_gloo(gloo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, int]]:
    """The other families' ``--check-parity`` rank jobs on 2 kept gloo ranks, in one call:
    ``{model_type: (document, window)}``."""
    jobs, windows = {}, {}
    for model_type, cls, extra in FAMILIES[1:]:
        artifact, config, windows[model_type] = _artifact(
            tmp_path_factory.mktemp(model_type), model_type, cls, extra)
        jobs[model_type] = rank_env(artifact, config, 2, check_parity=True)
    docs = gloo_launch(gloo, 2, jobs, worker=fresh_peak_cases)
    return {name: (docs[name], windows[name]) for name in jobs}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("model_type", [f[0] for f in FAMILIES[1:]])
def test_a_default_window_keeps_the_smoke_batch_small(on_gloo: dict, model_type: str) -> None:
    doc, window = on_gloo[model_type]
    _assert_small_batch(model_type, doc, window)


#: small parameters (about 130 million: half a GiB), attention scores of terabytes: 65536
#: heads of width 1 over a 512-token batch (a 64-token window is exercised up to the bound)
WIDE_SCORES = {"hidden_size": 64, "num_attention_heads": 2**16, "num_key_value_heads": 2,
               "head_dim": 1, "intermediate_size": 128, "num_hidden_layers": 16,
               "vocab_size": 256, "sliding_window": 64, "max_position_embeddings": 4096}


@pytest.mark.timeout(400)
def test_activations_that_cannot_fit_are_refused_before_the_build(tmp_path: Path,
                                                                  gloo) -> None:
    from hpcodegen.families.tiny import tiny_config
    from hpcodegen.generate.api import GenerateArgs, run_generate
    from hpcodegen.launch.launcher.options import LaunchOptions
    from hpcodegen.launch.launcher.supervise import JobOutcome
    from hpcodegen.launch.launcher.verdict import verdict
    from hpcodegen.launch.results import RankRecord

    config = tiny_config("mistral", "MistralForCausalLM") | WIDE_SCORES
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(config))
    assert run_generate(GenerateArgs(tmp_path / "cfg", 2, tmp_path / "art",
                                     verbosity=-1)) == 0
    check_in_process(tmp_path / "art", tmp_path / "cfg")  # what launch checks first
    job = rank_env(tmp_path / "art", tmp_path / "cfg", 2, check_parity=True)
    doc = gloo_launch(gloo, 2, {"wide_scores": job})["wide_scores"]
    records = {r["rank"]: RankRecord(**r) for r in doc["ranks"]}
    opts = LaunchOptions(artifact=tmp_path / "art", nproc=2, device="cpu",
                         model_dir=tmp_path / "cfg", check_parity=True, json=True)
    code, message = verdict(JobOutcome(records=records, returncode=1), opts, None, tmp_path)
    assert code == 2, (message, doc["ranks"])
    assert message.startswith("refused before building the model: rank "), message
    assert "activations" in message and "is available (" in message, message
    need = float(message.split("rank needs about ")[1].split(" GiB")[0])
    assert need > 4096, message  # terabytes: no machine this runs on has them
    assert all(r["local_param_bytes"] is None for r in doc["ranks"])  # nothing was built
