"""hpcodegen.gc_pause: imports with the collector paused, frozen only in our own processes.

Each case runs in a fresh interpreter (``gc.freeze`` cannot be undone for the objects it
moved, and the test process's own imports are long done)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import gc, sys
from hpcodegen.gc_pause import import_paused, own_process
if sys.argv[1] == "own":
    own_process()
import_paused("sys", "gc")  # imported already: nothing to freeze
before = gc.get_freeze_count()
import_paused("xml.dom.minidom", "email.mime.text")
print(before, gc.get_freeze_count(), gc.isenabled(), "xml.dom.minidom" in sys.modules)
"""


@pytest.mark.parametrize(("who", "frozen"), [("own", True), ("library", False)])
def test_fresh_imports_freeze_only_in_our_own_processes(who, frozen):
    out = subprocess.run([sys.executable, "-c", _PROBE, who], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    before, after, enabled, imported = out.stdout.split()
    assert before == "0" and imported == "True" and enabled == "True"  # the collector is back
    assert (int(after) > 0) is frozen, out.stdout


_CLI_PROBE = """
import os
import sys
from hpcodegen import gc_pause
from hpcodegen.cli.app import main
sys.argv = ["hpcodegen", "--version"]
try:
    main(None if os.environ["WHO"] == "script" else ["--version"])
except SystemExit:
    pass
print(gc_pause._OWN_PROCESS)
"""


@pytest.mark.parametrize(("who", "own"), [("script", "True"), ("caller", "False")])
def test_only_the_console_script_marks_the_process_its_own(who, own):
    """``main()`` as the console script runs it (argv from ``sys.argv``) marks the process
    as hpcodegen's; ``main(argv)`` called from someone's Python process does not."""
    import os

    out = subprocess.run([sys.executable, "-c", _CLI_PROBE], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "WHO": who})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == own, out.stdout
