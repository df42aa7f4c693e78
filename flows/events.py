"""The events trainguard emits for users' own automations, with the labels they filter on.

`trainguard.attempt.finished` once per attempt; `trainguard.run.succeeded` or `trainguard.run.gave-up`
once per run. The resource is the run (`trainguard.run.<run id>`) and carries labels an automation
can match on: category, retryable, run id, attempt, rule id, GPU-seconds, node. The attempt's flow
run is a related resource. Event ids derive from the run and attempt, so when the crash hook and the
retry controller both report a dead attempt, Prefect keeps one event.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from prefect.events import emit_event

from trainguard.core.attempt import AttemptSummary

ATTEMPT_FINISHED = "trainguard.attempt.finished"
RUN_SUCCEEDED = "trainguard.run.succeeded"
RUN_GAVE_UP = "trainguard.run.gave-up"
_NAMESPACE = uuid.UUID("6f1d0a52-3c55-4d8e-9a43-7f2b3f0b9e11")


def labels(summary: AttemptSummary) -> dict[str, str]:
    """The resource of a run's events: the run, labelled with what the attempt amounted to."""
    return {
        "prefect.resource.id": f"trainguard.run.{summary.run_id}",
        "prefect.resource.name": summary.run_id,
        "trainguard.run-id": summary.run_id,
        "trainguard.attempt": str(summary.attempt),
        "trainguard.state": summary.state,
        "trainguard.category": summary.category or "none",
        "trainguard.retryable": "true" if summary.retryable else "false",
        "trainguard.rule-id": summary.rule_id or "none",
        "trainguard.gpu-seconds": f"{summary.gpu_seconds:.1f}",
        "trainguard.node": summary.node or "unknown",
    }


def _related(summary: AttemptSummary) -> list[dict[str, str]]:
    if not summary.flow_run_id:
        return []
    return [{"prefect.resource.id": f"prefect.flow-run.{summary.flow_run_id}",
             "prefect.resource.role": "attempt", "prefect.resource.name": summary.flow_run_name or ""}]


def _emit(event: str, summary: AttemptSummary, key: str, payload: Mapping[str, Any]) -> None:
    emit_event(event=event, resource=labels(summary), related=_related(summary), payload=dict(payload),
               id=uuid.uuid5(_NAMESPACE, f"{event}/{key}"))


def report_attempt(summary: AttemptSummary, data: Mapping[str, Any]) -> None:
    """Both events an attempt's end can mean, in order: `trainguard.attempt.finished` (with its verdict and
    retry decision), then, when the run is over (it succeeded, or the policy gave up), the run's own.

    ``data`` is the summary as it was kept (`verdicts.Kept.data`): what the event carries as its payload.
    """
    _emit(ATTEMPT_FINISHED, summary, f"{summary.run_id}/{summary.attempt}", data)
    if summary.succeeded:
        _emit(RUN_SUCCEEDED, summary, summary.run_id, {"attempts": summary.attempt, "summary": data})
    elif not summary.retried:
        _emit(RUN_GAVE_UP, summary, summary.run_id, {
            "attempts": summary.attempt, "reason": summary.decision.reason if summary.decision else None,
            "summary": data})
