"""Fixtures shared by several tests/launch modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def user_script_run(tmp_path_factory: pytest.TempPathFactory):
    """The one tp 2 user-script launch that ``test_user_script.py`` and
    ``test_torch_dcp.py`` both read (:func:`user_scripts.launch_user_script`): a real
    launch, paid once per session (per xdist worker) instead of once per module."""
    from user_scripts import launch_user_script

    return launch_user_script(tmp_path_factory.mktemp("user_script"))
