"""Tasks that prepare and run the training command: thin wrappers over the backend's adapters."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from blocks.backends import LocalProcessBackend
from trainguard.core.local import ProcessOutcome
from trainguard.core.spec import TrainingSpec
from trainguard.core.workspace import AttemptWorkspace


class TrainingFailed(Exception):
    """The training command ended badly; carries the runner's outcome as plain data."""

    def __init__(self, message: str, outcome: dict[str, Any]) -> None:
        super().__init__(message, outcome)
        self.outcome = outcome

    def __str__(self) -> str:
        return str(self.args[0])


def outcome_dict(outcome: ProcessOutcome) -> dict[str, Any]:
    """A runner outcome as JSON-ready data."""
    data = asdict(outcome)
    data.update(
        started_at=outcome.started_at.isoformat(),
        finished_at=outcome.finished_at.isoformat(),
        log_path=str(outcome.log_path),
    )
    return data


@task(name="provision_workspace", cache_policy=NO_CACHE)
def provision_workspace(backend: LocalProcessBackend, run_id: str, attempt: int) -> AttemptWorkspace:
    """Create the attempt's workspace (logs, core dumps, the run's shared checkpoint folder)."""
    workspace = backend.workspace(run_id, attempt)
    get_run_logger().info("workspace %s, checkpoints in %s", workspace.root, workspace.checkpoint_dir)
    return workspace


@task(name="run_training", cache_policy=NO_CACHE)
def run_training(
    backend: LocalProcessBackend, spec: TrainingSpec, workspace: AttemptWorkspace, resume_from: str | None
) -> dict[str, Any]:
    """Run the training command through the container entrypoint; fail the task when it fails."""
    env = {**spec.env, "TRAINGUARD_RESUME_FROM": resume_from or ""}
    if spec.workdir:
        env["TRAINGUARD_WORKDIR"] = os.path.abspath(spec.workdir)
    outcome = backend.runner().run(
        spec.command,
        workspace=workspace,
        env=env,
        deadline_seconds=spec.deadline_seconds,
        stall_seconds=spec.stall_seconds,
    )
    data = outcome_dict(outcome)
    if outcome.exit_code != 0:
        raise TrainingFailed(f"training ended with {outcome.reason}: {outcome.message}", data)
    return data
