"""Tasks that prepare and run the training command: thin wrappers over the backend seam."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainguard.core.backend import AttemptRef, Backend, Launch


class TrainingFailed(Exception):
    """The training command ended badly; carries the backend's outcome as plain data."""

    def __init__(self, message: str, outcome: dict[str, Any]) -> None:
        super().__init__(message, outcome)
        self.outcome = outcome

    def __str__(self) -> str:
        return str(self.args[0])


@task(name="provision_workspace", cache_policy=NO_CACHE)
def provision_workspace(backend: Backend, run_id: str, attempt: int) -> AttemptRef:
    """Prepare the attempt's place on the backend (folders, volumes) and return how to find it."""
    ref = backend.provision(run_id, attempt)
    get_run_logger().info("%s attempt %s, checkpoints in %s", backend.kind, ref.name, ref.checkpoint_dir)
    return ref


@task(name="run_training", cache_policy=NO_CACHE)
def run_training(backend: Backend, ref: AttemptRef, launch: Launch) -> dict[str, Any]:
    """Launch the attempt and wait until it is terminal; fail the task when training failed."""
    outcome = backend.run(ref, launch)
    if not outcome.succeeded:
        raise TrainingFailed(f"training ended with {outcome.reason}: {outcome.message}", outcome.to_dict())
    return outcome.to_dict()


@task(name="release_attempt", cache_policy=NO_CACHE)
def release_attempt(backend: Backend, ref: AttemptRef) -> None:
    """Let the platform clean the attempt up, now that its evidence is kept."""
    backend.release(ref)
