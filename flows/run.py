"""The training-run flow: loops attempts as subflows, for direct calls without a deployment.

A notebook or `trainguard run` calls this; a deployment instead chains attempts through the attempt
flow's state hooks. Both follow the decision the attempt flow made, so there is one policy and two
drivers; `next_parameters` moves the lineage on for both. The backoff here is a plain sleep in
the parent run.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.client.schemas.objects import State
from prefect.runtime import flow_run as current_run
from prefect.states import Completed, Failed

from flows import uploads
from flows.attempt import spec_name, train_attempt
from tasks.report import publish_run_report
from trainguard.core.attempt import AttemptFailed, AttemptSummary, lineage_tags, new_run_id, next_parameters
from trainguard.core.policy import RetryDecision
from trainguard.core.spec import TrainingSpec


@flow(name="training-run", flow_run_name=spec_name)
def training_run(
    spec: TrainingSpec,
    run_id: str | None = None,
    backend_block: str | None = None,
    evidence_block: str | None = None,
    retry_policy_block: str | None = None,
    rules_file: str | None = None,
    resume: dict[str, Any] | None = None,
) -> State:
    """Run attempts of `spec` until one succeeds or the retry policy says stop.

    `resume` continues an earlier run: {"attempt": next number, "resume_from": checkpoint,
    "history": summaries of the attempts so far}, and optionally the lineage the policy moved on
    ("avoid_nodes", "memory_factor", "parent_flow_run_id"), as the retry controller passes them.
    """
    run_id = run_id or new_run_id(spec.name)
    params: dict[str, Any] = {
        "spec": spec, "attempt": 1, "run_id": run_id, "backend_block": backend_block,
        "evidence_block": evidence_block, "retry_policy_block": retry_policy_block, "rules_file": rules_file,
    }
    history: list[dict[str, Any]] = list((resume or {}).get("history") or [])
    if resume:
        params.update(attempt=int(resume["attempt"]), resume_from=resume.get("resume_from"), history=list(history))
        carried = ("avoid_nodes", "memory_factor", "parent_flow_run_id")
        params.update({key: resume[key] for key in carried if resume.get(key)})
    while True:
        with tags(*lineage_tags(run_id, params["attempt"], params.get("parent_flow_run_id"))):
            state = train_attempt(**params, return_state=True)
        summary = attempt_summary(state)
        if summary is None:
            return Failed(message=f"attempt {params['attempt']} failed before it ran: {state.message}", data=history)
        history.append(summary.to_dict())
        decision = summary.decision
        if summary.succeeded or decision is None or not decision.retry:
            break
        get_run_logger().info("attempt %s ended with %s; retrying as attempt %s in %gs", summary.attempt,
                              summary.category or "an unknown failure", decision.next_attempt, decision.delay_seconds)
        time.sleep(decision.delay_seconds)
        params = next_parameters(params, summary, decision, str(summary.flow_run_id))
    # the attempts' evidence went up to S3 in the background after each verdict: now wait for it
    finished = uploads.finish(run_id, [AttemptSummary.from_dict(h) for h in history])
    history = [s.to_dict() for s in finished]
    # the run report on this flow run too: the UI and a schedule show the parent run first
    publish_run_report(finished, on=str(current_run.id))
    storage = _storage_note(history)
    if summary.succeeded:
        return Completed(message=f"{run_id} succeeded on attempt {summary.attempt}{storage}", data=history)
    reason = decision.reason if decision is not None else "no retry decision was reached"
    return Failed(message=f"{run_id} failed: {reason}{storage}", data=history)


def _storage_note(history: list[dict[str, Any]]) -> str:
    """"; storage failed in attempt N: ..." for the first attempt that could not write everything, or what waits."""
    for item in history:
        if problems := item.get("storage_problems"):
            return f"; storage failed in attempt {item.get('attempt')}: {problems[0]}"
    waiting = [item for item in history if item.get("evidence_spooled")]
    if waiting:
        numbers = ", ".join(str(item.get("attempt")) for item in waiting)
        return (f"; the evidence of attempt {numbers} still waits in the local spool "
                f"({waiting[0].get('evidence_upload_error') or 'upload pending'}): `trainguard evidence flush`")
    return ""


def attempt_summary(state: State) -> AttemptSummary | None:
    """The summary an attempt flow left in its final state, or None if it ended without one."""
    result = state.result(raise_on_failure=False)
    if isinstance(result, AttemptFailed):
        return result.summary
    if isinstance(result, dict) and "attempt" in result:
        return AttemptSummary.from_dict(result)
    return None
