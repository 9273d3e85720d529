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


@pytest.fixture(scope="session")
def two_nodes(tmp_path_factory: pytest.TempPathFactory):
    """The two-node ``--check-parity --save`` launch from transformers' sharded weights
    that ``test_multi_node.py`` and ``test_checkpoints.py`` both read
    (:func:`launch_helpers.launch_two_nodes`): paid once per session (per xdist worker)."""
    from launch_helpers import launch_two_nodes

    return launch_two_nodes(tmp_path_factory.mktemp("two_nodes"))
