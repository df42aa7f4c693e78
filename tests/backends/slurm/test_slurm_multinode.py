"""Attempts of two nodes on the real test Slurm: one job with --nodes 2, one torchrun agent per node.

The test cluster runs two slurmd on this machine (`multi` holds both), so the job really spans two
Slurm nodes, each with its own task, folder and node id; the ranks meet over gloo at the first
node's address. Real DDP (tests/pytorch/scripts/train_ddp.py), two ranks per node.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from services.slurm_cluster import MULTI
from slurm_helpers import run, save_slurm_blocks
from waiting import wait_for

DDP = str(Path(__file__).resolve().parents[2] / "pytorch" / "scripts" / "train_ddp.py")


@pytest.fixture
def two_nodes(prefect_server, slurm_node_up, tmp_path) -> dict[str, Any]:
    cluster = slurm_node_up
    wait_for(lambda: cluster.run("sinfo", "--noheader", "--nodes", cluster.second_node, "--format=%T",
                                 check=False).stdout.strip() == "idle", timeout=60, what="the second node to be idle")
    return {**save_slurm_blocks(cluster, tmp_path, partition=MULTI), "cluster": cluster}


def _spec(name: str, *args: str, tmp_path: Path) -> dict[str, Any]:
    return {"name": name, "nodes": 2, "processes_per_node": 2,
            "command": [sys.executable, "-m", "torch.distributed.run", DDP, "--workdir", str(tmp_path), *args],
            "retry": {"max_attempts": 2, "delay_seconds": 0}}


def test_a_two_node_job_runs_one_agent_per_node_and_keeps_each_nodes_log(two_nodes, tmp_path) -> None:
    state, attempts = run(_spec("slurm-ddp-ok", "--fault", "none", "--steps", "3", tmp_path=tmp_path),
                          two_nodes, "slurm-ddp-ok-1")
    assert state.is_completed(), attempts
    folder = two_nodes["shared"] / "runs" / "slurm-ddp-ok-1" / "attempt-1"
    record = (folder / "slurm-job.json").read_text()
    assert '"--nodes=2"' in record and '"--ntasks-per-node=1"' in record
    for node in (folder, folder / "tasks" / "1"):
        log = next((node / "logs").glob("train-*.log")).read_text()
        assert "step 2 loss" in log  # every node trained; the two node ranks met at the first node
    env = (folder / "tasks" / "1" / "snapshot" / "env.json").read_text()
    assert '"NODE_RANK": "1"' in env and '"PET_NNODES": "2"' in env


def test_rank_2_on_the_second_node_is_the_culprit_though_the_first_nodes_ranks_fail_too(two_nodes, tmp_path) -> None:
    spec = _spec("slurm-ddp-shape", "--fault", "shape", "--fault-rank", "2", "--timeout-seconds", "30",
                 tmp_path=tmp_path)
    state, attempts = run(spec, two_nodes, "slurm-ddp-shape-1")
    assert state.is_failed() and len(attempts) == 1
    only = attempts[0]
    assert (only["category"], only["decision"]["retry"]) == ("code_error", False)
    root = only["root_cause"]
    assert (root["index"], root["rank"]) == (1, 2)
    assert root["node"] == two_nodes["cluster"].second_node
    assert {v["index"] for v in only["victims"]} >= {0}  # the first node's ranks only lost their peer
