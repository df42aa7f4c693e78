"""Slurm disruptions through the attempt flow: a flow process killed mid-job, a node set DOWN mid-job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from slurm_helpers import Meanwhile, job_states, jobcomp_lines, log_says, run, running_job, tiny_spec
from waiting import wait_for

from flows.attempt import train_attempt
from trainguard.core.slurm_job import job_name
from trainguard.core.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
_ATTEMPT = """
import json, sys
from flows.attempt import train_attempt
from trainguard.core.spec import parse_spec
args = json.loads(sys.argv[1])
train_attempt(parse_spec(args.pop("spec")), **args)
"""


def test_a_flow_killed_and_run_again_adopts_its_running_job_instead_of_submitting_another(
    prefect_server, slurm_blocks, slurm_cluster
):
    run_id = "slurm-adopt-1"
    spec = tiny_spec("slurm-adopt", "--steps", "80", "--step-seconds", "0.1")
    args = {"spec": spec, "attempt": 1, "run_id": run_id, "backend_block": slurm_blocks["backend_block"],
            "evidence_block": slurm_blocks["evidence_block"]}
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-c", _ATTEMPT, json.dumps(args)], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        job_id = running_job(slurm_cluster, run_id, 1, timeout=120)
        wait_for(log_says(slurm_blocks["shared"], run_id, 1, "step 10/"), what="training to make progress")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the flow process dies without a word; the job runs on
        first.wait()
    assert [state for jid, state in job_states(slurm_cluster, job_name(run_id, 1)) if jid == job_id] == ["RUNNING"]

    args.pop("spec")
    state = train_attempt(parse_spec(spec), **args, return_state=True)

    assert state.is_completed(), state.message
    record = json.loads((slurm_blocks["shared"] / "runs" / run_id / "attempt-1" / "slurm-job.json").read_text())
    assert record["job_id"] == job_id and len(record["adopted_at"]) == 1
    assert [jid for jid, _ in job_states(slurm_cluster, job_name(run_id, 1))] == [job_id]  # no second sbatch
    assert len(jobcomp_lines(slurm_cluster, job_name(run_id, 1))) == 1


def test_a_node_set_down_mid_job_is_a_node_failure_and_the_retry_waits_for_the_only_node(slurm_blocks, slurm_cluster):
    run_id = "slurm-nodedown-1"
    spec = tiny_spec("slurm-nodedown", "--steps", "60", "--step-seconds", "0.1")

    def disrupt() -> str:
        running_job(slurm_cluster, run_id, 1)
        wait_for(log_says(slurm_blocks["shared"], run_id, 1, "saved checkpoint step-000010"), what="a checkpoint")
        slurm_cluster.set_node("down", "trainguard test: node lost")
        # The only node is the one to avoid: the retry's job waits in the queue instead of being refused.
        wait_for(lambda: [s for _, s in job_states(slurm_cluster, job_name(run_id, 2)) if s == "PENDING"],
                 timeout=60, what="the retry's job to wait for a node")
        slurm_cluster.set_node("resume")
        return slurm_cluster.node_state()

    beside = Meanwhile(disrupt)
    beside.start()
    state, history = run(spec, slurm_blocks, run_id)
    beside.join_checked()

    assert state.is_completed(), state.message
    assert [(h["category"], h["termination_reason"]) for h in history[:1]] == [("node_failure", "NodeLost")]
    assert history[0]["node"] == slurm_cluster.node
    assert history[0]["decision"]["avoid_nodes"] == [slurm_cluster.node]
    assert "step-0000" in history[1]["resumed_from"]  # the newest checkpoint the lost node left
    second = json.loads((slurm_blocks["shared"] / "runs" / run_id / "attempt-2" / "slurm-job.json").read_text())
    assert not any(option.startswith("--exclude") for option in second["sbatch_options"])
    node_file = slurm_blocks["evidence"] / "runs" / run_id / "attempt-1" / "slurm" / f"scontrol-show-node-{slurm_cluster.node}.txt"
    assert "trainguard test: node lost" in node_file.read_text()


_GREEDY = """
import time
held = []
for i in range(40):
    held.append(bytearray(50 * 2**20))
    print(f"step {i} holding {50 * (i + 1)} MiB", flush=True)
    time.sleep(0.2)
"""


def test_a_job_over_its_memory_limit_is_a_host_oom(prefect_server, slurm_node_up, tmp_path):
    from slurm_helpers import save_slurm_blocks

    # No cgroups here: the cluster enforces --mem with jobacct_gather's OverMemoryKill, which kills
    # the step and says so in the job's stderr (with cgroups Slurm would also say OUT_OF_MEMORY).
    blocks = save_slurm_blocks(slurm_node_up, tmp_path, memory_mb=300)
    spec = {"name": "slurm-oom", "command": [sys.executable, "-c", _GREEDY], "retry": {"max_attempts": 1}}
    state, history = run(spec, blocks, "slurm-oom-1")

    assert state.is_failed()
    assert (history[0]["category"], history[0]["termination_reason"]) == ("host_oom", "OOMKilled")
    err = next((blocks["evidence"] / "runs" / "slurm-oom-1" / "attempt-1" / "slurm").glob("slurm-*.err")).read_text()
    assert "exceeded memory limit" in err
