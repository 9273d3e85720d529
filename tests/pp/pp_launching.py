"""What the pipeline launch tests share: the tiny configs, the CLI (in this process, or as
a subprocess where the launch path is what a test checks), a pipelined artifact at pp 2, a
JSON launch, the launch's rank job on the session's gloo worlds, and the verdict of an
exact ``--check-parity`` rank.

A real ``hpcodegen launch`` (torchrun, one process per rank, the launcher's model check and
verdict) stays where launching is what a test checks: ``--check-parity --steps`` of a
pipeline (with ``--compile``: one launch, :func:`shared_launch`, read by both tests);
``--save``/``--resume`` and the memory refusal's exit 2 through the launcher are
``tests/launch``'s. The numerics of every other feature (FSDP over dp, ``--max-grad-norm``,
pp x cp, loss parallelism, DualPipeV, MoE, saving and resuming at pp, the pipeline's memory
refusal) run the same rank job (:func:`hpcodegen.launch.rank.smoke.run`, with the
environment the launcher would give it,
:func:`hpcodegen.launch.launcher.command.job_environment`) on the session's kept gloo ranks
(:func:`gloo_launch`): same code, same numbers, without a torchrun, a launcher and N fresh
interpreters importing torch per case. Each case keeps its own result: a case that fails
names itself.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import launching
from launching import gloo_launch, ok_doc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))
from launch_helpers import check_in_process  # tests/launch, imported by module name

__all__ = ["gloo_launch", "ok_doc"]  # re-exported: tests/pp and tests/cp import them here

CONFIGS = Path(__file__).parent / "configs"
HPC = [sys.executable, "-m", "hpcodegen"]


#: artifacts generated in this process, by their generate flags (see :func:`generated`)
_GENERATED: dict[tuple[str, ...], Path] = {}
#: the flags of the real ``--check-parity --steps`` launch of llama4 at pp 2: the tests of
#: both features read it (``test_pp_launch.py``, ``test_pp_flags.py``). Its stages' layers
#: compile with dynamo and AOTAutograd, run without inductor's codegen (``aot_eager``):
#: what a pipeline adds to ``--compile`` is the tracing of each stage's layers and their
#: backward through the schedule; inductor's kernels (about 20 g++ builds, ~25 CPU-s cold)
#: are the real launch of ``tests/launch/test_compile_loss_parallel.py``'s
REAL_PARITY = ("--check-parity", "--steps", "2", "--compile", "--compile-backend", "aot_eager")
#: real launches made in this process, by their arguments (see :func:`shared_launch`)
_LAUNCHED: dict[tuple[str, ...], subprocess.CompletedProcess] = {}


def hpc(*args: str) -> tuple[int, str]:
    """``hpcodegen ARGS`` run in this process (the CLI's own ``main``): its exit code and
    stdout. The verbs are the same code as in a subprocess without the interpreter start
    and the torch import that each subprocess pays again."""
    from hpcodegen.cli.app import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue()


def generate(out: Path, config: str | Path, *flags: str) -> Path:
    """``generate --model CONFIG -o OUT FLAGS``: :func:`generated`'s copy of the one run of
    these flags in this process (the modules of this directory generate the same llama4
    pipelines, tp 2 and tied Gemma-2 artifacts again and again); fails naming its flags."""
    model = CONFIGS / config if isinstance(config, str) else config
    return generated(out.parent, out.name, "--model", str(model), *flags)


def generated(tmp_path: Path, name: str, *flags: str) -> Path:
    """``generate FLAGS`` into ``tmp_path/name``: a copy of the one run per distinct flags
    in this process. Generating is deterministic (the copy is byte for byte what a fresh
    run writes), so several tests launching the same artifact pay its generate once, and
    launch's model check passes it once (its verdict cache is keyed by these bytes). Each
    test gets its own copy to write into."""
    if flags not in _GENERATED:  # kept beside the tests' own dirs, in pytest's basetemp
        store = tmp_path.parent / "generated_pp" / str(len(_GENERATED))
        code, text = hpc("generate", *flags, "-o", store / name)
        assert code == 0, f"generate {flags} -> {code}:\n{text[-2000:]}"
        _GENERATED[flags] = store / name
    out = tmp_path / name
    shutil.copytree(_GENERATED[flags], out, ignore=shutil.ignore_patterns("__pycache__"))
    return out


def generate_pp(tmp_path: Path, config: str, tp: int, schedule: str) -> Path:
    """``generate --pp 2`` of ``configs/<config>`` at ``tp`` with 4 microbatches."""
    return generated(tmp_path, f"{config}_{schedule}_tp{tp}", "--model", str(CONFIGS / config),
                     "--tp", str(tp), "--pp", "2", "--pp-schedule", schedule,
                     "--microbatches", "4")


def launch_json(art: Path, config: str, nproc: int, *extra: str,
                timeout: int = 500) -> subprocess.CompletedProcess:
    """``launch ART --nproc N --model-dir configs/<config> --json EXTRA...``: a real launch
    (CLI, torchrun, one process per rank). Its model check runs first in this process
    (:func:`launch_helpers.check_in_process`: the artifact was generated here, torch is
    loaded), and the launch reads that verdict instead of starting the check's child."""
    check_in_process(art, CONFIGS / config)
    return subprocess.run([*HPC, "launch", str(art), "--nproc", str(nproc), "--model-dir",
                           str(CONFIGS / config), "--json", *extra],
                          capture_output=True, text=True, timeout=timeout)


def shared_launch(tmp_path: Path, config: str, tp: int, schedule: str, nproc: int,
                  *extra: str) -> subprocess.CompletedProcess:
    """:func:`launch_json` of :func:`generate_pp`'s artifact, run once per distinct
    arguments in this process: tests that check different fields of the same launch (the
    exact ``--check-parity`` ranks, the stages compiled by ``--compile``) read one real
    torchrun instead of paying one each."""
    key = (config, str(tp), schedule, str(nproc), *extra)
    if key not in _LAUNCHED:
        art = generate_pp(tmp_path, config, tp, schedule)
        _LAUNCHED[key] = launch_json(art, config, nproc, *extra)
    return _LAUNCHED[key]


def rank_env(art: Path, config: str | Path, nproc: int, *, steps: int = 0,
             check_parity: bool = False, save: Path | None = None,
             resume: Path | None = None, max_grad_norm: float | None = None
             ) -> dict[str, str]:
    """:func:`launching.rank_env` (the ``HPCODEGEN_*`` environment the launcher gives each
    rank) with ``config`` a name under ``configs/`` or a directory."""
    model = CONFIGS / config if isinstance(config, str) else Path(config)
    return launching.rank_env(art, model, nproc, steps=steps, check_parity=check_parity,
                              save=save, resume=resume, max_grad_norm=max_grad_norm)


def assert_rank_exact(rank: dict[str, Any], steps: int) -> None:
    """A rank's ``--check-parity --steps`` record: loss and every owned gradient within
    1e-5 of the unsharded model, the p2p ops as frozen, ``steps`` losses."""
    parity = rank["parity"]
    assert parity["grad_max_diff"] <= 1e-5 and parity["loss_max_diff"] <= 1e-5, parity
    assert parity["p2p"]["measured"] == parity["p2p"]["predicted"], parity
    assert parity["params_compared"] > 0
    assert len(rank["losses"]) == steps
