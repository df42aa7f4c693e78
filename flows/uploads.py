"""Waiting for the evidence uploads attempts leave going, and saying how they ended.

An attempt sends its evidence up only after its verdict (`trainguard.core.evidence.afterupload`), so the
next attempt is scheduled or started without waiting on S3. The process waits for those uploads
before it ends: a deployment's attempt in its state hooks, after the next attempt is scheduled;
the training-run flow once its last attempt is over. Each attempt's report is then published
again, saying what is in S3 and what still waits in the local spool, and the flow run's log says
it too.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from prefect import get_run_logger
from prefect.exceptions import MissingContextError
from prefect.logging import get_logger

from tasks.report import publish_attempt
from trainguard.core.evidence import afterupload, bundles
from trainguard.core.attempt import AttemptFailed, AttemptSummary, UploadStatus
from trainguard.core.evidence.manifest import Manifest


def finish_evidence_upload(flow: Any, flow_run: Any, state: Any) -> None:
    """on_completion / on_failure / on_crashed hook, after scheduling: wait for this attempt's upload."""
    if getattr(flow_run, "parent_task_run_id", None) is not None:
        return  # an attempt of the training-run flow, which waits once its attempts are over
    result = state.result(raise_on_failure=False) if state.is_completed() or state.is_failed() else None
    if isinstance(result, AttemptFailed):
        summary = result.summary
    elif isinstance(result, dict) and "attempt" in result:
        summary = AttemptSummary.from_dict(result)
    else:
        return  # no verdict: no upload was started after one
    earlier = [AttemptSummary.from_dict(h) for h in (flow_run.parameters or {}).get("history") or []]
    finish(summary.run_id, [*earlier, summary], only=summary.attempt)


def finish(run_id: str, summaries: list[AttemptSummary], only: int | None = None) -> list[AttemptSummary]:
    """Wait for the run's uploads to end and republish the reports of their attempts; the summaries, updated."""
    updated = list(summaries)
    index = {summary.attempt: i for i, summary in enumerate(updated)}
    for upload in afterupload.finish(run_id, None if only is None else [only]):
        if (i := index.get(upload.attempt)) is None:
            continue
        if (status := _status(upload)) is not None:
            updated[i] = updated[i].with_upload(status)
        _say(updated[i], upload.store)
        try:
            publish_attempt(updated[i], updated[:i])
        except Exception as exc:  # the report is how people see it: say so, plainly
            _logger().warning("could not publish the updated report of attempt %s: %s: %s",
                              upload.attempt, type(exc).__name__, exc)
    return updated


def _status(upload: afterupload.Upload) -> UploadStatus | None:
    """What is in the store and what still waits, read locally (a spool listing, presigned links)."""
    if not upload.manifest_json:
        return None
    status = bundles.upload_status(upload.store, Manifest.from_json(upload.manifest_json))
    return replace(status, upload_error=f"the upload broke: {upload.error}") if upload.error else status


def _say(summary: AttemptSummary, store: Any) -> None:
    where = getattr(store, "describe", lambda: "the evidence store")()
    if summary.evidence_spooled:
        _logger().warning("attempt %s: %d evidence items still wait in the local spool (%s); "
                          "`trainguard evidence flush` uploads them", summary.attempt,
                          len(summary.evidence_spooled), summary.evidence_upload_error or "upload pending")
    else:
        _logger().info("attempt %s: all its evidence is in %s", summary.attempt, where)


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except MissingContextError:
        return get_logger("trainguard.uploads")


__all__ = ["finish", "finish_evidence_upload"]
