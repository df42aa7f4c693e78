"""The evidence tasks: freeze what the attempt left behind, and keep the verdict beside it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainguard.core.evidence import afterupload, bundles, verdicts
from trainguard.core.attempt import AttemptSummary
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend, CollectedEvidence
from trainguard.core.backends.waits import said_while, span
from trainguard.core.evidence.manifest import Manifest
from trainguard.core.stores.base import EvidenceStore


@task(name="collect_evidence", cache_policy=NO_CACHE)
def collect_evidence(
    backend: Backend, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome | None, held: bool = False
) -> CollectedEvidence:
    """Have the backend copy everything the attempt left into the store; never raise for a missing piece.

    ``held``: the store spools every write until the verdict is kept (`afterupload`), so nothing waits on S3 yet.
    """
    logger = get_run_logger()
    with said_while(logger.info, lambda waited: f"trainguard: waiting {span(waited)} for the {backend.kind} backend to "
                    "collect the attempt's evidence (the platform's records, the logs, the attempt's files)"):
        collected = backend.collect_evidence(ref, store, outcome)
    if failures := collected.storage_problems:  # said as a warning: a full evidence disk is the user's to fix
        logger.warning("evidence could not be stored: %s", "; ".join(failures))
    absent = "; ".join(f"{item.name}: {item.reason}" for item in collected.manifest.absent)
    logger.info("kept %d evidence items in %s%s", len(collected.manifest.items), collected.location,
                f" (absent: {absent})" if absent else "")
    upload = bundles.upload_status(store, collected.manifest, held)
    if upload.spooled and not held:
        logger.warning("%d evidence items wait in the local spool (%s); `trainguard evidence flush` uploads them",
                       len(upload.spooled), upload.upload_error)
    return replace(collected, upload=upload)


@task(name="record_verdict", cache_policy=NO_CACHE)
def record_verdict(store: EvidenceStore, summary: AttemptSummary, manifest: Manifest | None,
                   held: bool = False, items: Mapping[str, bytes] | None = None) -> AttemptSummary:
    """Keep the attempt's classification and retry decision with its evidence (`verdicts.keep`), then let a
    held store's uploads start (`afterupload`); the summary as kept.

    Never raises or waits because of storage: what the store could not take is in the kept summary's
    storage problems, and said here as a warning. The next attempt is scheduled or started while the
    uploads go on; the process waits for them at its end.
    """
    kept = verdicts.keep(store, summary, "flow", manifest=manifest, items=items, held=held)
    for line in kept.warnings:
        get_run_logger().warning("%s", line)
    if held:  # the verdict index's record goes up with the bundle
        afterupload.start(store, summary.run_id, summary.attempt, kept.manifest.to_json() if kept.manifest else None,
                          (kept.index_key,))
    return kept.summary
