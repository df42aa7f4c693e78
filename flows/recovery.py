"""What is left of an attempt whose flow process died: its verdict, its leftover process, its evidence.

Used by the crash hook and the retry controller alike, so whichever gets there first does the work
and the other finds it done (`attempt_lock` makes them take turns when they fire at the same moment
on one machine): the verdict the flow kept beside its evidence is read back, a training process (or
Job) still running without its supervisor is stopped (through the backend, when it can), and
evidence the flow never collected is collected through the backend's own collector, before the stop
where the stop would remove it (`StopsOrphans.evidence_first`), masked with the run's secret_env
resolved again. The backend is the one the attempt ran on (`blocks.backend_reference`). Each step is
best effort and says what it did; none of them raises.
"""

from __future__ import annotations

import fcntl
import json
import logging
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect.exceptions import MissingContextError
from prefect.logging import get_logger, get_run_logger

from blocks import backend_reference, load_backend, load_evidence
from blocks.secrets import SecretEnvError, resolve_secret_env
from tasks.report import publish_run_report
from trainguard.core.evidence import index, manifest
from trainguard.core.reports import progress
from trainguard.core.attempt import AttemptSummary
from trainguard.core.backends.base import ERROR, AttemptOutcome, AttemptRef
from trainguard.core.backends.capabilities import StopsOrphans
from trainguard.core.spec import parse_spec
from trainguard.core.stores.base import EvidenceNotFound, EvidenceStore

logger = get_logger("trainguard.recovery")


def _log() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The run's logger inside a flow or task run (the retry controller: its logs show in the UI), else ours."""
    try:
        return get_run_logger()
    except MissingContextError:  # a state hook runs outside any run context
        return logger


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


def kept_verdict(params: dict[str, Any], run_id: str) -> AttemptSummary | None:
    """The verdict (summary with its retry decision) the attempt flow kept with its evidence, if any."""
    try:
        store = load_evidence(params.get("evidence_block"))
        data = json.loads(store.get_bytes(f"{manifest.attempt_prefix(run_id, int(params['attempt']))}/verdict.json"))
    except (EvidenceNotFound, ValueError, OSError, RecursionError) as exc:
        logger.debug("no verdict kept for %s attempt %s: %s", run_id, params.get("attempt"), exc)
        return None
    return AttemptSummary.from_dict(data) if isinstance(data, dict) and data.get("decision") else None


def recover_attempt(params: dict[str, Any], run_id: str, why: str) -> dict[str, Any]:
    """Stop what the dead attempt left running and collect its evidence if the flow could not.

    Returns the evidence figures (`location`, `items`, `missing`) and `stopped`, what was stopped.
    """
    attempt = int(params.get("attempt", 1))
    _mask_secret_env(params)
    backend = load_backend(backend_reference(params.get("backend_block"), params.get("spec")))
    ref = backend.provision(run_id, attempt)  # finds the attempt's place again; creates nothing new
    # Stop first where the stop leaves evidence behind (a local crash report); collect first where
    # the stop removes it (a deleted Job takes its pods and their logs).
    evidence_first = isinstance(backend, StopsOrphans) and backend.evidence_first
    stopped = None if evidence_first else _stop_orphan(backend, ref)
    outcome = AttemptOutcome(exit_code=None, signal=None, reason=ERROR,
                             message=f"the attempt's flow run died before it could report: {why}")
    store = load_evidence(params.get("evidence_block"))
    found = _existing_evidence(store, run_id, attempt)
    if found is None:
        collected = backend.collect_evidence(ref, store, outcome)
        _log().info("collected %d evidence items of %s attempt %s into %s", len(collected.manifest.items), run_id,
                    attempt, collected.location)
        found = collected.summary
    progress_marks = _progress(backend, ref, outcome)  # from the log the evidence kept, before any stop
    if evidence_first:
        stopped = _stop_orphan(backend, ref)
    return {**found, "stopped": stopped, "progress": progress_marks}


def _mask_secret_env(params: dict[str, Any]) -> None:
    """Resolve the run's secret_env again, only so that what recovery keeps masks it as the dead flow would
    have (the raw log on the cluster or the work folder holds whatever the command printed)."""
    try:
        resolve_secret_env(dict(parse_spec(params.get("spec") or {}).secret_env))
    except (SecretEnvError, ValueError) as exc:
        _log().warning("secret_env could not be resolved to mask it in the recovered evidence: %s", exc)


def keep_verdict(params: dict[str, Any], summary: AttemptSummary) -> None:
    """Keep the verdict reached after the attempt died beside its evidence, as the flow would have."""
    try:
        store = load_evidence(params.get("evidence_block"))
    except Exception as exc:  # the evidence stays as collected; the verdict also lives in the run's events
        logger.warning("could not keep the verdict of %s attempt %s: %s", summary.run_id, summary.attempt, exc)
        return
    data = json.dumps(summary.to_dict(), indent=2).encode("utf-8")
    problem = manifest.write_verdict(store, summary.run_id, summary.attempt, data, "retry-controller",
                                      datetime.now(timezone.utc).isoformat())
    manifest.release_space(store, summary.run_id, summary.attempt)  # set aside by the flow that died
    if problem:
        logger.warning("the verdict of %s attempt %s: %s", summary.run_id, summary.attempt, problem)
    _, problem = index.keep(store, summary)
    if problem:
        logger.warning("%s; the verdict itself is kept, only the fleet view misses it", problem)


def publish_report(summaries: list[AttemptSummary]) -> None:
    """The run's report with the dead attempt in its timeline (its own flow could not publish it)."""
    try:
        publish_run_report(summaries)
    except Exception as exc:  # the verdict and the retry matter more than the picture of them
        logger.warning("could not publish the report of %s: %s", summaries[-1].run_id, exc)


def _stop_orphan(backend: Any, ref: AttemptRef) -> str | None:
    if not isinstance(backend, StopsOrphans):
        return None
    try:
        stopped = backend.stop_orphan(ref)
    except Exception as exc:  # stopping is best effort; the evidence and the retry still matter
        logger.warning("could not stop what %s attempt %s left running: %s", ref.run_id, ref.attempt, exc)
        return None
    if stopped:
        _log().warning("%s attempt %s: %s", ref.run_id, ref.attempt, stopped)
    return stopped


def _progress(backend: Any, ref: AttemptRef, outcome: AttemptOutcome) -> list[tuple[int, float | None]]:
    try:
        log = backend.signals(ref, outcome).log
    except Exception:  # the chart is a nicety; a backend that cannot say is no reason to stop here
        return []
    if isinstance(log, bytes):
        log = log.decode("utf-8", errors="replace")
    return progress.read_progress(log if isinstance(log, str | Path) else None)


def _existing_evidence(store: EvidenceStore, run_id: str, attempt: int) -> dict[str, Any] | None:
    try:
        found = manifest.read_manifest(store, run_id, attempt)
    except (EvidenceNotFound, manifest.ManifestError, ValueError):
        return None
    return {"location": store.describe(manifest.attempt_prefix(run_id, attempt)), "items": len(found.items),
            "missing": len(found.absent)}
