"""The evidence step: freeze what the attempt left behind, let the platform clean up, keep the verdict beside it."""

from __future__ import annotations

from collections.abc import Mapping

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainguard.core.evidence import verdicts
from trainguard.core.attempt import AttemptSummary
from trainguard.core.backends.base import AttemptOutcome, AttemptRef, Backend, CollectedEvidence
from trainguard.core.backends.waits import said_while, span
from trainguard.core.evidence.manifest import Manifest
from trainguard.core.stores.base import EvidenceStore


@task(name="collect_evidence", cache_policy=NO_CACHE)
def collect_evidence(
    backend: Backend, ref: AttemptRef, store: EvidenceStore, outcome: AttemptOutcome | None
) -> CollectedEvidence:
    """Have the backend copy everything the attempt left into the store; never raise for a missing piece.

    A held store (`afterupload`) spools every write until the verdict is kept, so nothing waits on S3 yet;
    what still waits in the local spool is asked once, when the verdict is kept (`verdicts.keep`).
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
    return collected


@task(name="release_attempt", cache_policy=NO_CACHE)
def release_attempt(backend: Backend, ref: AttemptRef) -> None:
    """Let the platform clean the attempt up, now that its evidence is kept; back once nothing of it runs."""
    logger = get_run_logger()
    with said_while(logger.info, lambda waited: f"trainguard: waiting {span(waited)} for the {backend.kind} backend to "
                    "see the attempt's last processes end (a stopping pod may be saving a checkpoint on notice)"):
        problem = backend.release(ref)
    if problem:
        logger.warning("%s", problem)


def freeze(backend: Backend, ref: AttemptRef, store: EvidenceStore,
           outcome: AttemptOutcome) -> CollectedEvidence | None:
    """`collect_evidence`, then `release_attempt` (only now may the platform clean up); what was kept, or
    None when the collect task itself failed (the verdict is then kept without it)."""
    collected = collect_evidence(backend, ref, store, outcome, return_state=True).result(raise_on_failure=False)
    release_attempt(backend, ref, return_state=True)
    return collected if isinstance(collected, CollectedEvidence) else None


@task(name="record_verdict", cache_policy=NO_CACHE)
def record_verdict(store: EvidenceStore, summary: AttemptSummary, manifest: Manifest | None,
                   held: bool = False, items: Mapping[str, bytes] | None = None) -> verdicts.Kept:
    """Keep the attempt's classification and retry decision with its evidence (`verdicts.keep`, which
    also lets a held store's uploads start); the verdict as kept.

    Never raises or waits because of storage: what the store could not take is in the kept summary's
    storage problems, and said here as a warning. The next attempt is scheduled or started while the
    uploads go on; the process waits for them at its end.
    """
    kept = verdicts.keep(store, summary, "flow", manifest=manifest, items=items, held=held)
    for line in kept.warnings:
        get_run_logger().warning("%s", line)
    return kept


def keep_verdict(store: EvidenceStore, summary: AttemptSummary, manifest: Manifest | None,
                 held: bool = False, items: Mapping[str, bytes] | None = None) -> verdicts.Kept:
    """`record_verdict` run as the attempt's task; when the task itself fails, the verdict unkept, saying why."""
    kept = record_verdict(store, summary, manifest, held, items, return_state=True).result(raise_on_failure=False)
    if isinstance(kept, verdicts.Kept):
        return kept
    return verdicts.Kept.of(summary.with_storage_problems(f"verdict.json could not be stored: {kept}"), manifest, "")
