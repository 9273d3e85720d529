"""``hpcodegen launch``: run an artifact under torchrun and report every rank.

* :func:`run_launch` (the CLI verb's body): checks, the torchrun command, supervision.
* :func:`setup`: the helper a user script calls under ``hpcodegen launch ... -- train.py``
  to get ``(model, mesh_context)`` parallelized from the artifact (a ``Setup`` that also
  saves, resumes and clips by the global norm).

The two processes are two subpackages: :mod:`hpcodegen.launch.launcher` (the user's shell:
options, the torchrun command, supervision, display, verdict) and
:mod:`hpcodegen.launch.rank` (each torchrun rank: init, model, the built-in job, the user
script's helper). What they share is their contract: :mod:`hpcodegen.launch.env` (the
environment the launcher sets for the ranks) and :mod:`hpcodegen.launch.results` (the
per-rank state files the ranks write and the launcher reads).

Nothing here imports torch at module load; the ranks load it when they start.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_launch", "setup"]


def setup(**kwargs: Any) -> Any:
    """Init this rank; returns a ``Setup`` (unpacks as ``model, mesh_context``);
    see :func:`hpcodegen.launch.rank.helper.setup`."""
    from hpcodegen.launch.rank.helper import setup as _setup

    return _setup(**kwargs)


def run_launch(opts: Any) -> int:
    """Run one launch; see :func:`hpcodegen.launch.launcher.run.run_launch`."""
    from hpcodegen.launch.launcher.run import run_launch as _run

    return _run(opts)
