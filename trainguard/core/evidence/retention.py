"""How long evidence is kept: lifecycle rules for a bucket's prefix, outcome tags, and pruning.

Failed and successful attempts are told apart by a tag on every object of the attempt
(``trainguard-outcome``: ``failed`` or ``succeeded``), set once the verdict is known. The bucket's
lifecycle rules expire each kind after its own number of days, never fewer than 7 (a full
training cycle plus two retry windows); objects not tagged yet are never expired by a rule.
`prune` does the same from the verdicts in any store, and never deletes a run's newest failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from trainguard.core.evidence.bundles import BundleRecord, records
from trainguard.core.evidence.manifest import VERDICT, Manifest, add_items, attempt_prefix, manifest_key
from trainguard.core.stores.base import EvidenceStore, LifecycleStore, TaggingStore

OUTCOME_TAG = "trainguard-outcome"
MIN_DAYS = 7


class RetentionError(ValueError):
    """A retention setting is refused; the message names it and the fix."""


@dataclass(frozen=True)
class Retention:
    """Days to keep failed and successful attempts."""

    failed_days: int = 30
    succeeded_days: int = 7

    def __post_init__(self) -> None:
        for name, days in (("failed_days", self.failed_days), ("succeeded_days", self.succeeded_days)):
            if days < MIN_DAYS:
                raise RetentionError(f"{name}={days}: evidence is kept at least {MIN_DAYS} days (a training "
                                     f"cycle plus two retry windows); use {MIN_DAYS} or more")

    def days_for(self, attempt: BundleRecord) -> int:
        return self.failed_days if attempt.failed else self.succeeded_days


def lifecycle_rules(prefix: str, retention: Retention) -> list[dict[str, Any]]:
    """S3 lifecycle rules for the attempts under ``prefix`` (e.g. ``"trainguard/"``)."""
    base = f"{prefix}runs/"

    def expire(outcome: str, days: int) -> dict[str, Any]:
        return {
            "ID": f"trainguard-{outcome}:{prefix}"[:255], "Status": "Enabled",
            "Filter": {"And": {"Prefix": base, "Tags": [{"Key": OUTCOME_TAG, "Value": outcome}]}},
            "Expiration": {"Days": days},
        }

    return [
        expire("failed", retention.failed_days),
        expire("succeeded", retention.succeeded_days),
        {"ID": f"trainguard-incomplete-uploads:{prefix}"[:255], "Status": "Enabled", "Filter": {"Prefix": base},
         "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": MIN_DAYS}},
    ]


def merge_rules(existing: Iterable[dict[str, Any]], ours: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bucket's other rules kept, ours replacing their earlier versions."""
    ids = {rule["ID"] for rule in ours}
    return [rule for rule in existing if rule.get("ID") not in ids] + ours


def mark_outcome(store: EvidenceStore, run_id: str, attempt: int, succeeded: bool) -> int:
    """Tag every object of the attempt with its outcome; return how many (0 for stores without tags)."""
    if not isinstance(store, TaggingStore):
        return 0
    return store.tag_prefix(attempt_prefix(run_id, attempt) + "/", {OUTCOME_TAG: "succeeded" if succeeded else "failed"})


def add_verdict(store: EvidenceStore, manifest: Manifest, verdict: bytes, succeeded: bool, source: str,
                   recorded_at: str, items: Mapping[str, bytes] | None = None) -> Manifest:
    """Keep an attempt's verdict beside its evidence, list it in ``manifest``, and tag the attempt with its outcome.

    Nothing here reads the store back, so an object store that is away costs no waiting: the S3
    store spools the verdict, the rewritten manifest and the tagging (in that order) once S3 has
    failed, and `flush` carries them up later. Returns the manifest as it now stands.
    """
    updated = add_items(store, manifest.run_id, manifest.attempt, {**(items or {}), VERDICT: verdict}, source,
                        recorded_at, current=manifest)
    mark_outcome(store, manifest.run_id, manifest.attempt, succeeded)
    return updated


@dataclass(frozen=True)
class PruneDecision:
    """One attempt and whether prune deletes it, with why."""

    attempt: BundleRecord
    delete: bool
    reason: str


def plan_prune(attempts: Iterable[BundleRecord], retention: Retention, now: datetime) -> list[PruneDecision]:
    """Which attempts are past their retention; a run's newest failure is always kept."""
    listed = list(attempts)
    newest_failure = _newest_failures(listed)
    decisions = []
    for attempt in listed:
        days = retention.days_for(attempt)
        age = now - _parse(attempt.created_at, now)
        kind = "failed" if attempt.failed else "successful"
        if age < timedelta(days=days):
            decisions.append(PruneDecision(attempt, False, f"{kind}, {age.days} of {days} days"))
        elif newest_failure.get(attempt.run_id) == attempt.attempt:
            decisions.append(PruneDecision(attempt, False, f"the run's newest failure, kept past {days} days"))
        else:
            decisions.append(PruneDecision(attempt, True, f"{kind}, {age.days} days old (kept {days})"))
    return decisions


def _newest_failures(attempts: list[BundleRecord]) -> dict[str, int]:
    """run id -> its newest attempt judged failed; a run with none: its newest attempt never judged.

    An attempt without a verdict (lost, or its verdict still spooled) must not stand in for the
    run's real newest failure; it only does when the run has no judged failure at all.
    """
    ranked: dict[str, tuple[bool, int]] = {}
    for attempt in attempts:
        rank = (attempt.judged, attempt.attempt)
        if attempt.failed and rank > ranked.get(attempt.run_id, (False, 0)):
            ranked[attempt.run_id] = rank
    return {run_id: number for run_id, (_, number) in ranked.items()}


def prune(store: EvidenceStore, retention: Retention, now: datetime | None = None, dry_run: bool = False,
          on_decision: Callable[[PruneDecision], None] | None = None) -> list[PruneDecision]:
    """Delete the attempts `plan_prune` picks: the manifest first, so a half-pruned bundle is never complete."""
    decisions = plan_prune(records(store), retention, now or datetime.now(UTC))
    for decision in decisions:
        if on_decision:
            on_decision(decision)
        if decision.delete and not dry_run:
            run_id, attempt = decision.attempt.run_id, decision.attempt.attempt
            store.delete(manifest_key(run_id, attempt))
            for key in store.list_keys(attempt_prefix(run_id, attempt) + "/"):
                store.delete(key)
    return decisions


def _parse(stamp: str, fallback: datetime) -> datetime:
    try:
        parsed = datetime.fromisoformat(stamp)
    except ValueError:
        return fallback  # an unreadable date counts as new: never delete on a guess
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def apply_lifecycle(store: LifecycleStore, retention: Retention) -> list[dict[str, Any]]:
    """Put the rules for ``store``'s prefix on it (keeping its other rules); return them as read back."""
    ours = lifecycle_rules(store.prefix, retention)
    store.put_lifecycle(merge_rules(store.get_lifecycle(), ours))
    ids = {rule["ID"] for rule in ours}
    return [rule for rule in store.get_lifecycle() if rule.get("ID") in ids]
