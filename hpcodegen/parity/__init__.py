"""The parity harness: the parallelized model against the unsharded one.

:mod:`~hpcodegen.parity.harness` is the procedure (build the pair with the same weights,
install the plan, one forward/backward, compare logits and every gradient, count the
collectives against inspect-plan's prediction); :mod:`~hpcodegen.parity.gather` holds its
comparison rules (local shards to full tensors by the plan, reference tensors to shards by
the runtime's source info); :mod:`~hpcodegen.parity.ranks` spawns the gloo ranks the tests
and ``bench/coverage.py`` run it on. ``launch --check-parity`` runs the same comparison on
each rank.

Nothing here imports torch at module load.
"""
