"""What is left of an attempt whose flow process died: the crash hook's and the retry controller's side of it.

Used by the crash hook, the failure hook, the cancel hook and the retry controller alike: a finished
attempt's verdict is found by `verdict_of`. Whichever gets there first does the work and the other
finds it done (`attempt_lock` makes them take turns when they fire at the same moment on one
machine): the verdict the flow kept beside its evidence is read back; without one, an attempt whose
flow process died is recovered through the core's one recovery path (`trainguard.core.recovery`):
what it left running stopped, its evidence collected through the backend's own collector, masked
with the run's secret_env resolved again, judged preempted, its retry decided by the run's policy
and its verdict kept. The backend is the one the attempt ran on (`blocks.backend_reference`). The
dead run's parameters are read once (`AttemptRun`): its spec parsed once, its evidence store loaded once.
"""

from __future__ import annotations

import fcntl
import logging
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

from prefect.exceptions import MissingContextError
from prefect.logging import get_logger, get_run_logger

from blocks import backend_reference, load_backend, load_evidence, resolve_policy
from blocks.secrets import SecretEnvError, resolve_secret_env
from flows import events
from tasks.report import publish_attempt
from trainguard.core import policy, recovery
from trainguard.core.attempt import AttemptSummary, new_run_id
from trainguard.core.evidence import verdicts
from trainguard.core.spec import TrainingSpec, parse_spec
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.taxonomy import INFO, Category

logger = get_logger("trainguard.recovery")


def _log() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The run's logger inside a flow or task run (the retry controller: its logs show in the UI), else ours."""
    try:
        return get_run_logger()
    except MissingContextError:  # a state hook runs outside any run context
        return logger


@dataclass(frozen=True)
class AttemptRun:
    """A finished train-attempt flow run as the hooks and the controller read it: each part read once, when needed.

    Attributes:
        params: The run's parameters with the flow's defaults filled in (`hooks.bound_parameters`).
        flow_run_id: Its flow run's id (the run id is derived from it when the parameters name none).
    """

    params: Mapping[str, Any]
    flow_run_id: Any

    @cached_property
    def spec(self) -> TrainingSpec:
        return parse_spec(self.params["spec"])

    @cached_property
    def run_id(self) -> str:
        return str(self.params.get("run_id") or new_run_id(self.spec.name, self.flow_run_id))

    @property
    def attempt(self) -> int:
        return int(self.params.get("attempt", 1))

    @cached_property
    def store(self) -> EvidenceStore:
        return load_evidence(self.params.get("evidence_block"))

    def kept_verdict(self) -> AttemptSummary | None:
        """The verdict (summary with its retry decision) the attempt kept with its evidence, if any."""
        try:
            known = verdicts.read(self.store, self.run_id, self.attempt)
        except (ValueError, OSError) as exc:  # a block that cannot be loaded: no verdict to read
            logger.debug("no verdict kept for %s attempt %s: %s", self.run_id, self.attempt, exc)
            return None
        return known if known is not None and known.decision is not None else None


def verdict_of(run: AttemptRun, flow_run: Any, state: Any) -> AttemptSummary | None:
    """The finished attempt's verdict, however it ended; None when it failed before an attempt existed.

    Failed: the verdict it kept beside its evidence. Crashed: that verdict when it kept one before its
    process died, else the attempt recovered now (`recover_crashed`).
    """
    if state is None:
        return None
    if state.is_crashed():
        return recover_crashed(run, flow_run, (state.message or "flow run crashed")[:300])
    return run.kept_verdict() if state.is_failed() else None


def recover_crashed(run: AttemptRun, flow_run: Any, why: str) -> AttemptSummary:
    """The verdict of an attempt whose flow process died: the one it kept, else recovered now, judged preempted."""
    category = Category.PREEMPTED  # the process was terminated from outside (SIGTERM, kill)
    return _settle(run, flow_run, "Crashed", "retry-controller", recovery.Stop(
        category, "flow.crashed", why, INFO[category].remediation, "crashed:terminated"))


def recover_cancelled(run: AttemptRun, flow_run: Any, why: str) -> AttemptSummary:
    """The verdict of an attempt a person cancelled (the UI's Cancel, `prefect flow-run cancel`): the one it
    kept, else `user_cancelled`, never retried, with what it left collected as after a crash."""
    category = Category.USER_CANCELLED
    return _settle(run, flow_run, "Cancelled", "flow", recovery.Stop(
        category, "flow.cancelled", why, "cancelled on purpose; to continue from its newest checkpoint, run the "
        "deployment again with resume_from set, or `trainguard run SPEC --resume RUN_ID`", "cancelled:flow-run"))


@contextmanager
def attempt_lock(run_id: str, attempt: int) -> Iterator[None]:
    """Let one recovery of an attempt at a time go on, on this machine.

    The crash hook and the retry controller may fire at the same moment; the second waits here and
    then finds the first one's verdict, so the attempt is judged, collected and reported once. The
    lock is a file lock in the temporary folder: it covers the hook and the controller of one host
    (the served deployments, one worker). Across hosts the scheduling itself still happens once (the
    idempotency key); only the recovery could then run twice.
    """
    folder = Path(tempfile.gettempdir()) / "trainguard-recovery"
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:200]
    with (folder / f"{name}-attempt-{attempt}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _settle(run: AttemptRun, flow_run: Any, state: str, source: str, stop: recovery.Stop) -> AttemptSummary:
    with attempt_lock(run.run_id, run.attempt):  # a hook and the controller at once
        # it may have judged itself before the process died, or another recovery just did
        return run.kept_verdict() or _recover(run, flow_run, state, source, stop)


def _recover(run: AttemptRun, flow_run: Any, state: str, source: str, stop: recovery.Stop) -> AttemptSummary:
    spec = run.spec
    _mask_secret_env(spec)
    retry_policy = resolve_policy(spec, run.params.get("retry_policy_block"))
    earlier = [AttemptSummary.from_dict(item) for item in run.params.get("history") or ()]  # read once
    begun = AttemptSummary(
        run_id=run.run_id, attempt=run.attempt, max_attempts=retry_policy.max_attempts, state=state,
        flow_run_id=str(flow_run.id), flow_run_name=flow_run.name, gpus=spec.total_gpus,
        resumed_from=run.params.get("resume_from"), duration_seconds=_run_seconds(flow_run),
    )
    recovered = recovery.recover(
        load_backend(backend_reference(run.params.get("backend_block"), spec)), run.store, begun, judge=stop.judge,
        decide=lambda summary, checkpoints: policy.decide_retry(
            retry_policy, [s.record() for s in (*earlier, summary)], checkpoints),
        source=source, say=_log().info)
    if recovered.stopped:
        _log().warning("%s attempt %s: %s", run.run_id, run.attempt, recovered.stopped)
    for line in recovered.warnings:
        logger.warning("%s attempt %s: %s", run.run_id, run.attempt, line)
    summary = recovered.summary
    _log().info("recovered %s attempt %s: %d evidence items in %s", run.run_id, run.attempt, summary.evidence_items,
                summary.evidence)
    _publish_reports(summary, earlier)
    events.report_attempt(summary, recovered.kept.data)
    return summary


def _mask_secret_env(spec: TrainingSpec) -> None:
    """Resolve the run's secret_env again, only so that what recovery keeps masks it as the dead flow would
    have (the raw log on the cluster or the work folder holds whatever the command printed)."""
    try:
        resolve_secret_env(dict(spec.secret_env))
    except (SecretEnvError, ValueError) as exc:
        _log().warning("secret_env could not be resolved to mask it in the recovered evidence: %s", exc)


def _publish_reports(summary: AttemptSummary, earlier: list[AttemptSummary]) -> None:
    """The reports its own flow would have published (the run's timeline, the attempt's report, the table of
    attempts), on the dead attempt's flow run."""
    try:
        publish_attempt(summary, earlier)
    except Exception as exc:  # the verdict and the retry matter more than the picture of them
        logger.warning("could not publish the reports of %s attempt %s: %s", summary.run_id, summary.attempt, exc)


def _run_seconds(flow_run: Any) -> float:
    """How long the dead attempt held its resources, as far as the API knows."""
    start = getattr(flow_run, "start_time", None)
    if start is None:
        return 0.0
    end = getattr(flow_run, "end_time", None) or datetime.now(timezone.utc)
    return max(0.0, float((end - start).total_seconds()))
