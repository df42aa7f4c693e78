"""The training-run flow: loops attempts as subflows, for direct calls without a deployment.

A notebook or `trainguard run` calls this; a deployment instead chains attempts through the attempt
flow's state hooks. Both follow the decision the attempt flow made, so there is one policy and two
drivers. The backoff here is a plain sleep in the parent run.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, tags
from prefect.states import Completed, Failed, State

from flows.attempt import spec_name, train_attempt
from trainguard.core.attempt import AttemptFailed, AttemptSummary, lineage_tags, new_run_id
from trainguard.core.spec import TrainingSpec


@flow(name="training-run", flow_run_name=spec_name)
def training_run(
    spec: TrainingSpec,
    run_id: str | None = None,
    backend_block: str | None = None,
    evidence_block: str | None = None,
    retry_policy_block: str | None = None,
    rules_file: str | None = None,
) -> State:
    """Run attempts of `spec` until one succeeds or the retry policy says stop."""
    run_id = run_id or new_run_id(spec.name)
    history: list[dict[str, Any]] = []
    resume_from, parent, attempt = None, None, 1
    while True:
        with tags(*lineage_tags(run_id, attempt, parent)):
            state = train_attempt(
                spec, attempt=attempt, run_id=run_id, resume_from=resume_from, parent_flow_run_id=parent,
                history=list(history), backend_block=backend_block, evidence_block=evidence_block,
                retry_policy_block=retry_policy_block, rules_file=rules_file, return_state=True,
            )
        summary = attempt_summary(state)
        if summary is None:
            return Failed(message=f"attempt {attempt} failed before it ran: {state.message}", data=history)
        history.append(summary.to_dict())
        decision = summary.decision
        if summary.succeeded or not decision.get("retry"):
            break
        time.sleep(float(decision.get("delay_seconds", 0)))
        resume_from, parent, attempt = decision.get("resume_from"), summary.flow_run_id, attempt + 1
    if summary.succeeded:
        return Completed(message=f"{run_id} succeeded on attempt {attempt}", data=history)
    return Failed(message=f"{run_id} failed: {decision.get('reason')}", data=history)


def attempt_summary(state: State) -> AttemptSummary | None:
    """The summary an attempt flow left in its final state, or None if it ended without one."""
    result = state.result(raise_on_failure=False)
    if isinstance(result, AttemptFailed):
        return result.summary
    if isinstance(result, dict) and "attempt" in result:
        return AttemptSummary.from_dict(result)
    return None
