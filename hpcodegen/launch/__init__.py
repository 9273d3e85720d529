"""``hpcodegen launch``: run an artifact under torchrun and report every rank.

* :func:`run_launch` (the CLI verb's body): checks, the torchrun command, supervision.
* :func:`setup`: the helper a user script calls under ``hpcodegen launch ... -- train.py``
  to get ``(model, mesh_context)`` parallelized from the artifact (a ``Setup`` that also
  saves, resumes and clips by the global norm).

Nothing here imports torch at module load; the ranks load it when they start.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_launch", "setup"]


def setup(**kwargs: Any) -> Any:
    """Init this rank; returns a ``Setup`` (unpacks as ``model, mesh_context``);
    see :func:`hpcodegen.launch.helper.setup`."""
    from hpcodegen.launch.helper import setup as _setup

    return _setup(**kwargs)


def run_launch(opts: Any) -> int:
    """Run one launch; see :func:`hpcodegen.launch.run.run_launch`."""
    from hpcodegen.launch.run import run_launch as _run

    return _run(opts)
