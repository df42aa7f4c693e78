"""The shared avoid list (the Prefect Variable) honoured by an attempt's job on the real two-node test Slurm.

The blocks name the `multi` partition, which holds both nodes, so a one-node job could land on
either: the job's `--exclude` is read back from the attempt's job record and from the controller
(`scontrol show job`: ExcNodeList, and the node it ran on), and the nodes the list may leave are
what `placeable_nodes` reads from the real `sinfo`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from prefect.variables import Variable
from services.slurm_cluster import MULTI, SlurmCluster
from slurm_helpers import run, save_slurm_blocks, tiny_spec
from waiting import wait_for

from blocks import SlurmBackend
from trainguard.core.fleet.avoid import VARIABLE

LATER, EARLIER = "2099-01-01T00:00:00Z", "2020-01-01T00:00:00Z"


def second_node_idle(cluster: SlurmCluster) -> bool:
    done = cluster.run("sinfo", "--noheader", "--nodes", cluster.second_node, "--format=%T", check=False)
    return done.stdout.strip() == "idle"


@pytest.fixture
def both_nodes(prefect_server, slurm_node_up, tmp_path) -> dict[str, Any]:
    cluster = slurm_node_up
    wait_for(lambda: second_node_idle(cluster), timeout=60, what="the second node to be idle")
    yield {**save_slurm_blocks(cluster, tmp_path, partition=MULTI), "cluster": cluster}
    Variable.unset(VARIABLE)


def entry(node: str, expires_at: str) -> dict[str, str]:
    return {"node": node, "reason": "3 gpu_fault in 12 attempts", "expires_at": expires_at, "added_by": "test"}


def attempt(blocks: dict[str, Any], run_id: str) -> tuple[dict[str, Any], dict[str, str]]:
    """One attempt of the tiny trainer: its verdict, and the controller's record of its job."""
    state, _ = run(tiny_spec(run_id.rsplit("-", 1)[0], retry={"max_total_attempts": 1}), blocks, run_id)
    assert state.is_completed(), state.message
    verdict = json.loads((blocks["evidence"] / "runs" / run_id / "attempt-1" / "verdict.json").read_text())
    record = json.loads((blocks["shared"] / "runs" / run_id / "attempt-1" / "slurm-job.json").read_text())
    shown = blocks["cluster"].run("scontrol", "show", "job", record["job_id"]).stdout
    fields = dict(word.split("=", 1) for word in shown.split() if "=" in word)
    return verdict, {**fields, "options": " ".join(record["sbatch_options"])}


def test_the_job_excludes_an_avoided_node_and_an_expired_entry_is_ignored(both_nodes) -> None:
    cluster = both_nodes["cluster"]
    Variable.set(VARIABLE, [entry(cluster.node, LATER), entry(cluster.second_node, EARLIER)], overwrite=True)

    verdict, job = attempt(both_nodes, "slurm-avoid-1")

    assert f"--exclude={cluster.node}" in job["options"]
    assert job["ExcNodeList"] == cluster.node and job["NodeList"] == cluster.second_node
    assert verdict["node"] == cluster.second_node
    assert [e["node"] for e in verdict["avoid_list"]] == [cluster.node] and verdict["avoid_note"] == ""


def test_a_list_that_would_leave_no_node_is_not_applied_and_the_verdict_says_so(both_nodes) -> None:
    cluster = both_nodes["cluster"]
    Variable.set(VARIABLE, [entry(cluster.node, LATER), entry(cluster.second_node, LATER)], overwrite=True)

    verdict, job = attempt(both_nodes, "slurm-avoid-2")

    assert "--exclude" not in job["options"] and job["ExcNodeList"] == "(null)"
    assert sorted(e["node"] for e in verdict["avoid_list"]) == sorted([cluster.node, cluster.second_node])
    assert "would leave 0 of 2 nodes" in verdict["avoid_note"] and "ran anyway" in verdict["avoid_note"]


def test_a_drained_node_is_not_placeable_so_avoiding_the_other_is_not_applied(both_nodes) -> None:
    cluster = both_nodes["cluster"]
    cluster.set_node("drain", reason="trainguard-test")  # the fixture resumes it
    wait_for(lambda: cluster.node_state() == "drain", timeout=30, what="the first node to be drained")
    backend = SlurmBackend.load(both_nodes["backend_block"].split("/", 1)[1]).backend()
    assert backend.placeable_nodes() == [cluster.second_node]
    Variable.set(VARIABLE, [entry(cluster.second_node, LATER)], overwrite=True)

    verdict, job = attempt(both_nodes, "slurm-avoid-3")

    assert "--exclude" not in job["options"] and job["NodeList"] == cluster.second_node
    assert "would leave 0 of 1 nodes" in verdict["avoid_note"]
