"""SIGTERM to `trainguard run` on a real Slurm: the job is cancelled, the attempt recorded, the resume line printed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from slurm_helpers import job_states, running_job, tiny_spec
from waiting import wait_for

from trainguard.core.backends.slurm.job import job_name

ROOT = Path(__file__).resolve().parents[3]


def test_sigterm_to_trainguard_run_on_slurm_cancels_the_job_and_records_the_attempt(slurm_blocks, slurm_cluster,
                                                                                      prefect_server, tmp_path):
    spec = tiny_spec("slurm-stopped", "--fail-at-step", "0")
    spec["command"] = [*spec["command"][:3], "4000", "--step-seconds", "0.05"]  # outlasts the test
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": prefect_server, "COLUMNS": "200",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    cli = subprocess.Popen([sys.executable, "-m", "trainguard.cli", "run", "run.yaml", "--backend",
                            slurm_blocks["backend_block"], "--evidence", slurm_blocks["evidence_block"]],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    runs = slurm_blocks["shared"] / "runs"
    run_id = wait_for(lambda: next((p.name for p in runs.iterdir()), None) if runs.is_dir() else None, 120,
                      "the run's folder in the shared folder")
    job = running_job(slurm_cluster, run_id, 1, timeout=120)

    cli.send_signal(signal.SIGTERM)
    out, err = cli.communicate(timeout=120)

    assert cli.returncode == 143, out[-3000:] + err[-3000:]
    assert "attempt 1 recorded as preempted" in out and f"resume with: trainguard run run.yaml --resume {run_id}" in out
    wait_for(lambda: not [s for j, s in job_states(slurm_cluster, job_name(run_id, 1)) if j == job and s in
                          ("RUNNING", "PENDING", "COMPLETING")], 60, f"Slurm job {job} to end")
    verdict = json.loads((slurm_blocks["evidence"] / "runs" / run_id / "attempt-1" / "verdict.json").read_text())
    assert verdict["category"] == "preempted" and verdict["decision"]["retry"] is False
