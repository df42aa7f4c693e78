"""The evidence tasks: freeze what the attempt left behind, and keep the verdict beside it."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainguard.core.evidence import bundles, index, manifest, retention
from trainguard.core.attempt import AttemptSummary
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend
from trainguard.core.stores.base import EvidenceStore


@task(name="collect_evidence", cache_policy=NO_CACHE)
def collect_evidence(
    backend: Backend, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome | None, held: bool = False
) -> dict[str, Any]:
    """Have the backend copy everything the attempt left into the store; never raise for a missing piece.

    ``held``: the store spools every write until the verdict is kept (`afterupload`), so nothing waits on S3 yet.
    """
    collected = backend.collect_evidence(ref, store, outcome)
    failures = manifest.storage_failures(collected.manifest)
    if failures:  # said as a warning: a full evidence disk is the user's to fix, not a detail
        get_run_logger().warning("evidence could not be stored: %s", "; ".join(failures))
    absent = "; ".join(f"{item.name}: {item.reason}" for item in collected.manifest.absent)
    get_run_logger().info("kept %d evidence items in %s%s", len(collected.manifest.items), collected.location,
                          f" (absent: {absent})" if absent else "")
    status = {**bundles.upload_status(store, collected.manifest), "uploading": held}
    if status["spooled"] and not held:
        get_run_logger().warning("%d evidence items wait in the local spool (%s); `trainguard evidence flush` "
                                 "uploads them", len(status["spooled"]), status["upload_error"])
    return {**collected.summary, **status, "manifest": collected.manifest.to_json(), "storage_problems": failures}


@task(name="record_verdict", cache_policy=NO_CACHE)
def record_verdict(store: EvidenceStore, summary: AttemptSummary, manifest_json: str | None,
                   held: bool = False) -> dict[str, Any]:
    """Keep the attempt's classification and retry decision with its evidence (`verdict.json`), tagged,
    and its record in the store's verdict index.

    Never raises because of storage: an S3 store that is away spools the verdict, and a store that
    cannot take it (a full disk) is said in ``storage_problem`` (the index's in ``index_problem``),
    which the attempt reports. Returns the bundle's upload status afterwards (what is still spooled,
    links), for the report, and the index record's key (``index_key``), which goes up with the bundle.
    """
    kept = _keep_verdict(store, summary, manifest_json, held)
    key, problem = index.keep(store, summary)
    if problem:
        get_run_logger().warning("%s; the verdict itself is kept, only the fleet view misses it", problem)
    return {**kept, "index_key": key, "index_problem": problem}


def _keep_verdict(store: EvidenceStore, summary: AttemptSummary, manifest_json: str | None,
                  held: bool) -> dict[str, Any]:
    data = json.dumps(summary.to_dict(), indent=2).encode("utf-8")
    now = datetime.now(timezone.utc).isoformat()
    current = manifest.Manifest.from_json(manifest_json) if manifest_json else None
    try:
        if current is None:
            current = manifest.read_manifest(store, summary.run_id, summary.attempt)
        updated = retention.add_verdict(store, current, data, summary.succeeded, "flow", now)
    except Exception as exc:  # store what can be stored, and say what could not
        get_run_logger().warning("could not keep the verdict with its evidence: %s: %s", type(exc).__name__, exc)
        problem = manifest.write_verdict(store, summary.run_id, summary.attempt, data, "flow", now)
        if problem:
            get_run_logger().warning("%s", problem)
        status = {**bundles.upload_status(store, current), "uploading": held} if current else {}
        return {**status, "storage_problem": problem, "manifest": current.to_json() if current else None}
    status = {**bundles.upload_status(store, updated), "uploading": held}
    if status["spooled"] and not held:
        get_run_logger().warning("the verdict waits in the local spool with %d evidence items (%s)",
                                 len(status["spooled"]), status["upload_error"])
    return {**status, "storage_problem": None, "manifest": updated.to_json()}
