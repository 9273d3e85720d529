"""Each rank of ``hpcodegen launch``: what torchrun starts, once per process.

:mod:`.worker` (the entry module torchrun runs: the built-in job or the user's script),
:mod:`.context` (device, process group, artifact meta, device mesh: ``init_rank``),
:mod:`.device` and :mod:`.mesh` (which accelerator and backend; the mesh layout, also read
by the launcher for its checks and display), :mod:`.model` (the model, its weights, the
synthetic batch), :mod:`.smoke` (the built-in job: build, forward, parity through
:mod:`hpcodegen.parity.harness`, steps, save), :mod:`.preflight` + :mod:`.memory` (the
memory check before anything is allocated), :mod:`.reporter` (this rank's record in the
run dir), :mod:`.helper` (``hpcodegen.launch.setup()`` for a user's script).
"""
