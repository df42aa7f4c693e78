"""Helpers for the Slurm flow tests: run a training run, act on the cluster while it runs, read jobs."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runs import tiny_spec  # noqa: F401  (re-exported for the tests here)
from services.slurm_cluster import SlurmCluster
from waiting import wait_for

from blocks import EvidenceFolder, SlurmBackend
from flows.run import training_run
from trainguard.core.backends.slurm.client import accounting_rows
from trainguard.core.backends.slurm.job import job_name
from trainguard.core.spec import parse_spec


def run(spec: dict[str, Any], blocks: dict[str, Any], run_id: str) -> tuple[Any, list[dict[str, Any]]]:
    """The training-run flow on the Slurm backend, in this process: (final state, attempt history)."""
    state = training_run(parse_spec(spec), run_id=run_id, backend_block=blocks["backend_block"],
                         evidence_block=blocks["evidence_block"], return_state=True)
    return state, state.result(raise_on_failure=False)


def job_states(cluster: SlurmCluster, name: str) -> list[tuple[str, str]]:
    """(job id, state) of every job named `name` the controller still holds, in any state."""
    done = cluster.run("squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i|%T", check=False)
    return [tuple(line.split("|", 1)) for line in done.stdout.split() if "|" in line]  # type: ignore[misc]


def running_job(cluster: SlurmCluster, run_id: str, attempt: int, timeout: float = 60) -> str:
    """Wait until the attempt's job runs; its id."""
    name = job_name(run_id, attempt)
    found = wait_for(lambda: [j for j, s in job_states(cluster, name) if s == "RUNNING"], timeout=timeout,
                     what=f"job {name} to run", interval=0.1)
    return found[0]


def log_says(shared: Path, run_id: str, attempt: int, text: str) -> Callable[[], bool]:
    log = shared / "runs" / run_id / f"attempt-{attempt}" / "logs" / f"train-{run_id}-attempt-{attempt}.log"
    return lambda: log.is_file() and text in log.read_text(errors="replace")


class Meanwhile(threading.Thread):
    """Runs `action` beside the flow (which keeps the main thread); `join_checked` re-raises its failure."""

    def __init__(self, action: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._action = action
        self.error: BaseException | None = None
        self.result: Any = None

    def run(self) -> None:
        try:
            self.result = self._action()
        except BaseException as exc:  # handed to the test thread
            self.error = exc

    def join_checked(self, timeout: float = 60) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "the action beside the flow did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def jobcomp_lines(cluster: SlurmCluster, name: str) -> list[str]:
    """The job-completion records (jobcomp/filetxt) of jobs named `name`."""
    if not cluster.jobcomp_log.is_file():
        return []
    return [line for line in cluster.jobcomp_log.read_text().splitlines() if f" Name={name} " in line]


def sacct_steps(path: Path, job_id: str) -> dict[str, dict[str, str]]:
    """The sacct record kept as evidence (`slurm/sacct.txt`), by job or step id, for job `job_id`."""
    return {row["JobID"]: row for row in accounting_rows(path.read_text()) if row["JobID"].split(".")[0] == job_id}


def save_slurm_blocks(cluster: SlurmCluster, tmp_path, **fields: Any) -> dict[str, Any]:
    """Saved Slurm backend and evidence blocks for one test, with its own shared folder."""
    suffix = uuid.uuid4().hex[:8]
    SlurmBackend(shared_folder=str(tmp_path / "shared"), slurm_conf=str(cluster.conf), poll_max_seconds=0.5,
                 **fields).save(f"slurm-{suffix}")
    EvidenceFolder(root=str(tmp_path / "evidence")).save(f"evidence-{suffix}")
    return {
        "backend_block": f"trainguard-slurm-backend/slurm-{suffix}",
        "evidence_block": f"evidence-{suffix}",
        "shared": tmp_path / "shared",
        "evidence": tmp_path / "evidence",
    }
