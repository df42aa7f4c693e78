"""The evidence tasks: freeze what the attempt left behind, and keep the verdict beside it."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainguard.core import bundles, manifest, retention
from trainguard.core.attempt import AttemptSummary
from trainguard.core.backend import AttemptOutcome, AttemptRef, Backend
from trainguard.core.stores import EvidenceStore


@task(name="collect_evidence", cache_policy=NO_CACHE)
def collect_evidence(
    backend: Backend, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome | None
) -> dict[str, Any]:
    """Have the backend copy everything the attempt left into the store; never raise for a missing piece."""
    collected = backend.collect_evidence(ref, store, outcome)
    failures = manifest.storage_failures(collected.manifest)
    if failures:  # said as a warning: a full evidence disk is the user's to fix, not a detail
        get_run_logger().warning("evidence could not be stored: %s", "; ".join(failures))
    absent = "; ".join(f"{item.name}: {item.reason}" for item in collected.manifest.missing)
    get_run_logger().info("kept %d evidence items in %s%s", len(collected.manifest.items), collected.location,
                          f" (absent: {absent})" if absent else "")
    status = bundles.upload_status(store, collected.manifest)
    if status["spooled"]:
        get_run_logger().warning("%d evidence items wait in the local spool (%s); `trainguard evidence flush` "
                                 "uploads them", len(status["spooled"]), status["upload_error"])
    return {**collected.summary, **status, "storage_problems": failures}


@task(name="record_verdict", cache_policy=NO_CACHE)
def record_verdict(store: EvidenceStore, summary: AttemptSummary) -> str | None:
    """Keep the attempt's classification and retry decision with its evidence (`verdict.json`).

    Never raises: returns None, or one line saying what could not be stored (a full disk), which
    the attempt reports as a storage failure.
    """
    data = json.dumps(summary.to_dict(), indent=2).encode("utf-8")
    now = datetime.now(timezone.utc).isoformat()
    problem = manifest.record_verdict(store, summary.run_id, summary.attempt, data, "flow", now)
    try:
        retention.mark_outcome(store, summary.run_id, summary.attempt, summary.succeeded)  # lifecycle rules key on it
    except Exception as exc:
        get_run_logger().warning("could not tag the evidence with its outcome: %s: %s", type(exc).__name__, exc)
    if problem:
        get_run_logger().warning("%s", problem)
    return problem
