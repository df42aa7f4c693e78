"""A real single-node Slurm for the session, and per-test Slurm backend and evidence blocks.

The cluster (tests/slurm/cluster.py) runs munged, slurmctld and slurmd on loopback from a throwaway
folder; `./dev test` installs slurm-wlm and munge. The flows run on the session's Prefect server
(tests/conftest.py). Nothing here is mocked: jobs are real sbatch jobs running the tiny trainer.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from slurm.cluster import SlurmCluster, missing_binaries
from slurm_helpers import save_slurm_blocks
from waiting import wait_for



@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """munged, slurmctld and slurmd for the session; the node is idle when this yields."""
    missing = missing_binaries()
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)} missing): run ./dev test, which installs "
                    "slurm-wlm and munge")
    root = tmp_path_factory.mktemp("slurm")
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        wait_for(lambda: cluster.node_state() == "idle", timeout=60, what="the Slurm node to be idle", interval=0.2)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def slurm_node_up(slurm_cluster):
    """The node is idle before the test and brought back after it, whatever the test did to it."""
    if slurm_cluster.node_state() != "idle":
        slurm_cluster.set_node("resume")
    wait_for(lambda: slurm_cluster.node_state() == "idle", timeout=60, what="the Slurm node to be idle", interval=0.2)
    yield slurm_cluster
    if slurm_cluster.node_state() not in ("idle", "mixed", "allocated"):
        slurm_cluster.set_node("resume")


@pytest.fixture
def slurm_blocks(prefect_server, slurm_node_up, tmp_path) -> dict[str, Any]:
    return save_slurm_blocks(slurm_node_up, tmp_path)
