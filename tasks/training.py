"""The training step: prepare the attempt's place, run the command, and hand back its outcome."""

from __future__ import annotations

import threading
from dataclasses import replace

from prefect import get_client, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, StateType
from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run as current_run
from prefect.states import Failed

from blocks.secrets import SecretEnvError, resolve_secret_env
from trainguard.core.backends import stopreason
from trainguard.core.backends.base import START_ERROR, AttemptOutcome, AttemptRef, Backend, Launch
from trainguard.core.reports.livelog import LiveLog
from trainguard.core.masking import SECRET_NAMES_VARIABLE


class TrainingFailed(Exception):
    """The training command ended badly; carries the backend's outcome (every argument goes to super: picklable)."""

    def __init__(self, message: str, outcome: AttemptOutcome) -> None:
        super().__init__(message, outcome)
        self.outcome = outcome

    def __str__(self) -> str:
        return str(self.args[0])

    def __repr__(self) -> str:
        # Prefect logs the failed state with its data: the outcome may carry a 200-line output tail
        return f"TrainingFailed({self.args[0]!r})"


CANCEL_ASK_SECONDS = 5.0  # then the stop goes on without the answer: the worker's kill grace is running


def cancelled_by_person(exc: BaseException) -> str | None:
    """``cancelled`` when the SIGTERM that stops this flow run is a person's cancel: the UI's Cancel (or
    `prefect flow-run cancel`) sets the run Cancelling before the worker signals its process. Asked of
    the Prefect API within `CANCEL_ASK_SECONDS`; None for any other stop, or without an answer."""
    run_id = current_run.id if isinstance(exc, TerminationSignal) else None
    if not run_id:
        return None
    answer: list[bool] = []

    def ask() -> None:
        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(run_id).state
        except Exception:  # noqa: BLE001 - no answer: the entrypoint's own reason stands
            return
        answer.append(state is not None and state.type in (StateType.CANCELLING, StateType.CANCELLED))

    asking = threading.Thread(target=ask, name="ask-if-cancelled", daemon=True)
    asking.start()
    asking.join(CANCEL_ASK_SECONDS)
    return "cancelled" if answer and answer[0] else None


stopreason.learn(cancelled_by_person)


@task(name="provision_workspace", cache_policy=NO_CACHE)
def provision_workspace(backend: Backend, run_id: str, attempt: int) -> AttemptRef:
    """Prepare the attempt's place on the backend (folders, volumes) and return how to find it."""
    ref = backend.provision(run_id, attempt)
    get_run_logger().info("%s attempt %s, checkpoints in %s", backend.kind, ref.name, ref.checkpoint_dir)
    return ref


@task(name="run_training", cache_policy=NO_CACHE)
def run_training(
    backend: Backend, ref: AttemptRef, launch: Launch, secret_env: dict[str, str] | None = None
) -> AttemptOutcome | State:
    """Launch the attempt and wait until it is terminal; a Failed state when training failed.

    ``secret_env`` holds references (block names, ``env:NAME``); their values are resolved only
    here, inside the attempt, so they never travel as parameters. The command's output streams to
    this task's run logger while it runs, masked and rate-limited (`LiveLog`).
    """
    try:
        secrets = resolve_secret_env(secret_env or {})
    except SecretEnvError as exc:
        outcome = AttemptOutcome(exit_code=None, signal=None, reason=START_ERROR, message=str(exc))
        message = f"training never started: {exc}"
        return Failed(message=message, data=TrainingFailed(message, outcome))
    if secrets:  # the entrypoint masks these by value too, whatever they are called
        launch = replace(launch, env={**launch.env, **secrets, SECRET_NAMES_VARIABLE: ",".join(sorted(secrets))})
    logger = get_run_logger()
    live = LiveLog(lambda line: logger.info("%s", line))
    try:
        outcome = backend.run(ref, launch, on_line=live)
    finally:
        live.close()
    if not outcome.succeeded:
        # an expected outcome, not a crash: a Failed state with one line, no traceback in the log
        message = f"training ended with {outcome.reason}: {outcome.message}"
        return Failed(message=message, data=TrainingFailed(message, outcome))
    return outcome


def train(backend: Backend, ref: AttemptRef, launch: Launch, secret_env: dict[str, str]) -> AttemptOutcome:
    """`run_training` run as the attempt's task; the backend's outcome whether it completed or failed."""
    result = run_training(backend, ref, launch, secret_env, return_state=True).result(raise_on_failure=False)
    if isinstance(result, TrainingFailed):
        return result.outcome
    if isinstance(result, AttemptOutcome):
        return result
    return AttemptOutcome.never_ran(f"{type(result).__name__}: {result}")
