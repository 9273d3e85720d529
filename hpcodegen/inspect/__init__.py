"""``hpcodegen inspect-plan``: what a frozen plan will run, read from the meta alone.

Modules, one job each (imports run one way: ``run`` -> ``render`` / ``volume`` -> ``options``):

* :mod:`~hpcodegen.inspect.options`: the options, the result type, ``--mesh`` parsing;
* :mod:`~hpcodegen.inspect.run`: :func:`run_inspect` (load, gate, classify, predict);
* :mod:`~hpcodegen.inspect.render`: the documented JSON shape and the rich tables;
* :mod:`~hpcodegen.inspect.volume` and :mod:`~hpcodegen.inspect.trace`: ``--hf-config``
  bytes per rank from a meta-device forward (the only part that imports torch, lazily).
"""

from hpcodegen.inspect.options import Inspection, InspectOptions, parse_mesh
from hpcodegen.inspect.run import run_inspect

__all__ = ["InspectOptions", "Inspection", "parse_mesh", "run_inspect"]
