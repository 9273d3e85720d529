"""The launcher process of ``hpcodegen launch``: what runs in the user's shell.

:mod:`.options` (the request, checked before anything starts), :mod:`.run` (the verb's body,
``--dry-run`` included), :mod:`.command` (the exact torchrun command line and each rank's
environment), :mod:`.deathsig` (the shim torchrun runs under: it ends with the launcher),
:mod:`.torchrun` (torchrun keeping its per-rank failure records), :mod:`.supervise` (run
the job, watch the ranks' files), :mod:`.procs` (end a job completely), :mod:`.display`
(the table, the live view, the JSON document), :mod:`.verdict` (one exit code and one line).

It reads what the ranks write through :mod:`hpcodegen.launch.results` and talks to them only
through the environment of :mod:`hpcodegen.launch.env`. From the rank side it reads only
the pure parts (the mesh layout, the device choice, the memory hint); torch is imported
only to ask for a ``cuda`` device.
"""
