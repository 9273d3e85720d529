"""A user script under ``hpcodegen launch ARTIFACT -- train.py``: setup() gives the model,
sharded from the safetensors weights found in ``--model-dir``, and what the script needs to
clip by the global norm, save and resume.

The script (``user_scripts.SCRIPT``) and its launch are shared with ``test_torch_dcp.py``
(the session fixture ``user_script_run``): one tp 2 launch runs both files' parts.
"""

from __future__ import annotations

import pytest


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_setup_in_user_script_loads_safetensors(user_script_run):
    run = user_script_run.run
    assert run.code == 0, run.stdout + run.stderr
    doc = run.json()
    assert [r["status"] for r in doc["ranks"]] == ["ok", "ok"]
    assert all(r["weights"] == "1 safetensors file(s)" for r in doc["ranks"])
    assert all(r["local_param_bytes"] > 0 for r in doc["ranks"])
    assert "script args ['--lr', '3e-4']" in run.stderr
