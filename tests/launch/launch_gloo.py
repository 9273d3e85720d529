"""Launch's rank job on the session's kept gloo ranks, for the launch tests whose subject is
the numbers a rank reports (exactness against the unsharded model), not the launching.

Every launch feature keeps a real ``hpcodegen launch`` in its own test (torchrun, the
launcher's model check and verdict, one fresh process per rank): ``--check-parity``
(``test_parity.py``), ``--save`` (``test_checkpoints.py``), ``--resume`` at another mesh,
``--compile``, faults, blame, timeouts. The cases run here (bf16, twenty steps with sequence
parallelism, three AdamW steps of the example, the loss-parallel artifact) run the same rank
job (:func:`hpcodegen.launch.rank.smoke.run`) with the environment the launcher gives each
rank (:func:`hpcodegen.launch.launcher.command.job_environment`, after the options' own
check) on real gloo ranks forked from a preloaded parent: same code, same numbers, without
a launcher, a torchrun and two fresh interpreters importing torch and transformers per
case. A module fixture runs its module's cases in one call; each test asserts its own case
and :func:`ok_doc` fails naming it.

The worker (``smoke_cases``) and the per-case document (``gloo_launch``, ``ok_doc``) are
tests/pp's (``pp_workers``, ``pp_launching``): one definition of "launch's rank job on a
kept gloo rank" for both directories.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

_PP = str(Path(__file__).resolve().parents[1] / "pp")
if _PP not in sys.path:  # tests/ directories are not packages: the pp helpers by name
    sys.path.append(_PP)

from pp_launching import gloo_launch, ok_doc  # noqa: E402

__all__ = ["gloo_launch", "ok_doc", "rank_env"]


def rank_env(artifact: Path, model_dir: Path, nproc: int, **options: Any) -> dict[str, str]:
    """The ``HPCODEGEN_*`` environment ``launch ARTIFACT --nproc N --model-dir DIR`` with
    ``options`` (:class:`LaunchOptions` fields: ``steps``, ``check_parity``, ``dtype``...)
    gives each rank: the options pass their own check first, as on the command line."""
    from hpcodegen.launch import env
    from hpcodegen.launch.launcher.command import job_environment
    from hpcodegen.launch.launcher.options import LaunchOptions

    opts = LaunchOptions(artifact=Path(artifact), nproc=nproc, device="cpu",
                         model_dir=Path(model_dir), json=True, **options)
    opts.check()
    out = job_environment(opts, run_dir=Path(artifact), device="cpu")
    del out[env.RUN_DIR]  # the gloo ranks keep their record in memory and return it
    return out
