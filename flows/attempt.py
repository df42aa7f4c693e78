"""The attempt flow: one flow run is one training attempt.

provision → train → collect evidence (always, in a `finally`) → classify → decide retry → report.
The flow ends Completed when training succeeded, else Failed with the classification and the retry
decision in its message and data; the state hooks carry the decision out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import flow
from prefect.context import TagsContext
from prefect.runtime import flow_run as current_run
from prefect.client.schemas.objects import State
from prefect.states import Failed

from blocks import backend_reference, load_backend, load_evidence, resolve_policy
from flows import events
from flows.hooks import keep_cancelled_verdict, schedule_next_attempt, settle_lost_attempt
from flows.uploads import finish_evidence_upload
from tasks.evidence import freeze, keep_verdict
from tasks.fleet import read_avoid_list
from tasks.report import publish_report
from tasks.training import provision_workspace, train
from tasks.triage import classify_failure, decide_retry, read_checkpoints
from trainguard.core.attempt import (
    STACKS_TABLE, AttemptFailed, AttemptSummary, Judgement, lineage_tags, new_run_id, stacks_table,
)
from trainguard.core.evidence import afterupload, manifest
from trainguard.core.backends.base import AttemptOutcome, Launch
from trainguard.core.spec import TrainingSpec


def spec_name() -> str:
    """The run spec's name, for flow run names."""
    spec = current_run.parameters.get("spec") or {}
    return str(spec.get("name") if isinstance(spec, dict) else getattr(spec, "name", "run"))


@contextmanager
def lineage_off_tasks(run_id: str, attempt: int, parent_flow_run_id: str | None) -> Iterator[None]:
    """The attempt's tasks without the lineage tags its flow run carries.

    `training_run` tags each attempt's flow run with its lineage (`trainguard-run:<run>`,
    `attempt:<n>`, `parent:<id>`) through Prefect's tags context, which every task run inside would
    inherit too. Prefect's client acquires a tag-concurrency slot for each tag of a task run before it
    starts it, a round trip to the server that took about 2 s before evidence collection; no
    concurrency limit can meaningfully name tags unique to one run, so the tasks go without them.
    Tags a caller set around the run (a concurrency limit's tag, say) stay on the tasks; the flow
    runs keep every tag, for the UI, filters and automations.
    """
    lineage = set(lineage_tags(run_id, attempt, parent_flow_run_id))
    with TagsContext(current_tags=TagsContext.get().current_tags - lineage):
        yield


def attempt_run_name() -> str:
    """`{spec name}-a{attempt}`, so the UI lists attempts readably."""
    return f"{spec_name()}-a{current_run.parameters.get('attempt', 1)}"


@flow(
    name="train-attempt",
    flow_run_name=attempt_run_name,
    on_completion=[finish_evidence_upload],
    on_failure=[schedule_next_attempt, finish_evidence_upload],  # the next attempt first: it never waits on S3
    on_crashed=[schedule_next_attempt, finish_evidence_upload],
    on_cancellation=[keep_cancelled_verdict, finish_evidence_upload],  # a person's cancel: kept, not retried
)
def train_attempt(
    spec: TrainingSpec,
    attempt: int = 1,
    run_id: str | None = None,
    resume_from: str | None = None,
    parent_flow_run_id: str | None = None,
    history: list[dict[str, Any]] | None = None,
    avoid_nodes: list[str] | None = None,
    memory_factor: float = 1.0,
    backend_block: str | None = None,
    evidence_block: str | None = None,
    retry_policy_block: str | None = None,
    rules_file: str | None = None,
) -> dict[str, Any] | State:
    """Run one attempt of `spec` and judge it; see the module docstring for the shape.

    Args:
        spec: the run spec (command, env, limits, retry settings).
        attempt: this attempt's number, from 1.
        run_id: the run all attempts share; derived from this flow run's id when absent.
        resume_from: the checkpoint the command resumes from (TRAINGUARD_RESUME_FROM).
        parent_flow_run_id: the failed attempt this one retries (lineage, shown in the UI).
        history: summaries of the earlier attempts, for the circuit breaker and the report.
        avoid_nodes: nodes earlier attempts failed on; backends that place work on nodes avoid them.
        memory_factor: scale of the backend's memory request and limit (the policy's host_oom option).
        backend_block, evidence_block, retry_policy_block: saved blocks as `slug/name` (a bare name means
            the local-process backend or evidence folder); None = the defaults.
        rules_file: a user's triage rule file layered over the shipped rules.
    """
    run_id = run_id or new_run_id(spec.name, current_run.id)
    with lineage_off_tasks(run_id, attempt, parent_flow_run_id):
        if current_run.run_count > 1:  # the same flow run again, after its process was stopped (an evicted pod)
            lost, decision = settle_lost_attempt(train_attempt, current_run.id)
            return _ends(lost, lost.to_dict(), decision.reason)
        backend, store = load_backend(backend_reference(backend_block, spec)), load_evidence(evidence_block)
        retry_policy = resolve_policy(spec, retry_policy_block)
        earlier = [AttemptSummary.from_dict(item) for item in history or ()]  # read once: the policy and the report
        held = afterupload.hold(store)  # S3 gets the evidence after the verdict: judging never waits on it
        # before the attempt can fill the disk: space for the manifest and verdict that say what happened
        unreserved = manifest.reserve_space(store, run_id, attempt)
        shared = read_avoid_list(backend, spec.nodes)  # the fleet's avoid list, when it leaves enough nodes
        launch = Launch.of(spec, run_id=run_id, attempt=attempt, resume_from=resume_from,
                           avoid_nodes=[*(avoid_nodes or ()), *shared.avoid], memory_factor=memory_factor)
        summary = AttemptSummary(
            run_id=run_id, attempt=attempt, max_attempts=retry_policy.max_attempts, state="Failed",
            flow_run_id=str(current_run.id), flow_run_name=current_run.name, gpus=spec.total_gpus,
            memory_factor=memory_factor, resumed_from=resume_from, avoided_nodes=tuple(avoid_nodes or ()),
            avoid_list=tuple(entry.to_dict() for entry in shared.in_force), avoid_note=shared.note,
        )
        ref, outcome, collected = None, AttemptOutcome.never_ran("training never started"), None
        try:
            ref = provision_workspace(backend, run_id, attempt)
            outcome = train(backend, ref, launch, dict(spec.secret_env))
        finally:  # also on SIGTERM and deadlines: freeze the crime scene before anything else
            if ref is not None:
                collected = freeze(backend, ref, store, outcome)
        checkpoints = read_checkpoints(backend, ref, outcome, run_id, attempt, resume_from)
        judgement = classify_failure(backend, ref, outcome, rules_file)
        summary = checkpoints.into(outcome.into(summary))
        summary = (collected.into(summary, unreserved) if collected else summary).with_judgement(judgement)
        decision = decide_retry(retry_policy, [s.record() for s in (*earlier, summary)], list(checkpoints.listing))
        kept = keep_verdict(store, summary.with_decision(decision), collected.manifest if collected else None, held,
                            _whole_stacks(judgement))
        publish_report(kept.summary, earlier)
        events.report_attempt(kept.summary, kept.data)
        return _ends(kept.summary, kept.data, decision.reason)


def _whole_stacks(judgement: Judgement) -> dict[str, bytes]:
    """The whole stacks' table, every rank's row, as an evidence item (the summary carries a part of it)."""
    if judgement.hang is None:
        return {}
    return {STACKS_TABLE: json.dumps(stacks_table(judgement.hang), indent=1).encode("utf-8")}


def _ends(summary: AttemptSummary, data: dict[str, Any], reason: str) -> dict[str, Any] | State:
    """The flow run's end: Completed with the kept summary's data, or Failed carrying the summary; the failure
    hook schedules the next."""
    if summary.succeeded:
        return data
    message = f"attempt {summary.attempt} failed: {summary.category} ({summary.rule_id}); {reason}"
    return Failed(message=message, data=AttemptFailed(message, summary))
