"""launch's rank job on the session's kept gloo ranks: one definition for tests/launch,
tests/pp and tests/cp.

A case is the ``HPCODEGEN_*`` environment the launcher gives each rank (:func:`rank_env`:
the launcher's own :func:`hpcodegen.launch.launcher.command.job_environment`, after the
options' own check); :func:`smoke_cases` runs each case's job
(:func:`hpcodegen.launch.rank.smoke.run`) on a kept gloo rank as torchrun would run it;
:func:`gloo_launch` returns each case in the shape of ``launch --json``'s document, and
:func:`ok_doc` fails naming a case whose ranks did not all end ``ok``. Same code and
numbers as a launch, without a launcher, a torchrun and a fresh interpreter importing torch
and transformers per rank and case: the tests whose subject is launching keep a real
``hpcodegen launch``.

Imported by module name: ``tests/`` is on ``sys.path`` as the directory of the suite's
``conftest.py`` (tests/ directories are not packages), and the gloo ranks receive the
test process's ``sys.path`` with each job (:mod:`hpcodegen.parity.ranks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def rank_env(artifact: str | Path, model_dir: str | Path, nproc: int,
             **options: Any) -> dict[str, str]:
    """The ``HPCODEGEN_*`` environment ``launch ARTIFACT --nproc N --model-dir DIR`` with
    ``options`` (:class:`LaunchOptions` fields: ``steps``, ``check_parity``, ``dtype``,
    ``save``, ``resume``...) gives each rank: the options pass their own check first, as on
    the command line."""
    from hpcodegen.launch import env
    from hpcodegen.launch.launcher.command import job_environment
    from hpcodegen.launch.launcher.options import LaunchOptions

    opts = LaunchOptions(artifact=Path(artifact), nproc=nproc, device="cpu",
                         model_dir=Path(model_dir), json=True, **options)
    opts.check()
    out = job_environment(opts, run_dir=Path(artifact), device="cpu")
    del out[env.RUN_DIR]  # the gloo ranks keep their record in memory and return it
    return out


def smoke_cases(cases: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
    """``{name: {"mesh", "record"}}``: launch's rank job
    (:func:`hpcodegen.launch.rank.smoke.run`) for each ``(name, HPCODEGEN_* environment)``
    on this kept gloo rank, as torchrun would run it (its ``RANK``/``LOCAL_RANK``/
    ``WORLD_SIZE``/``LOCAL_WORLD_SIZE`` set; the process group is the world's). A case that
    raises is recorded as the worker would (``error``) and the next one runs."""
    import os
    import traceback

    import torch.distributed as dist

    from hpcodegen.launch import env
    from hpcodegen.launch.rank import smoke
    from hpcodegen.launch.rank.artifact import rank_artifact
    from hpcodegen.launch.rank.mesh import resolve_mesh_layout
    from hpcodegen.launch.rank.reporter import RankReporter
    from hpcodegen.launch.results import RankRecord

    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {}
    for name, job_env in cases:
        before = dict(os.environ)
        for key in env.ALL:
            os.environ.pop(key, None)
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank),
                           "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
                           **job_env})
        reporter = RankReporter(None, RankRecord(rank=rank, local_rank=rank,
                                                 world_size=world, device="cpu"))
        try:
            smoke.run(reporter)
        except Exception as exc:
            traceback.print_exc()
            reporter.fail_with(exc)
        finally:
            os.environ.clear()
            os.environ.update(before)
        plan = rank_artifact(job_env[env.ARTIFACT]).loaded.plan
        layout = resolve_mesh_layout(plan, world)
        out[name] = {"mesh": dict(zip(layout.names, layout.sizes, strict=True)),
                     "record": reporter.record.to_json()}
        dist.barrier()
    return out


def gloo_launch(gloo: Callable[..., list[Any]], nproc: int,
                cases: Mapping[str, dict[str, str]],
                worker: Callable[[list[tuple[str, dict[str, str]]]], dict[str, Any]]
                = smoke_cases) -> dict[str, dict[str, Any]]:
    """Each case's rank job (``{name: rank_env(...)}``) on ``nproc`` kept gloo ranks, one
    after the other in one call: ``{name: {"mesh": {...}, "ranks": [record, ...]}}``, the
    shape of ``launch --json``'s document. ``worker`` is :func:`smoke_cases` or a
    module-level function that calls it (the ranks import it by name)."""
    per_rank = gloo(nproc, worker, list(cases.items()))
    return {name: {"mesh": per_rank[0][name]["mesh"],
                   "ranks": [r[name]["record"] for r in per_rank]} for name in cases}


def ok_doc(docs: Mapping[str, dict[str, Any]], name: str) -> dict[str, Any]:
    """Case ``name``'s document when every rank ended ``ok`` (what exit 0 of a launch
    means); else fail naming the case and each rank's status and error."""
    doc = docs[name]
    bad = [(r["rank"], r["status"], r["phase"], r["error"]) for r in doc["ranks"]
           if r["status"] != "ok"]
    assert not bad, f"case {name}: ranks not ok: {bad}"
    return doc
