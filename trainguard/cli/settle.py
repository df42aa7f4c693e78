"""What `trainguard run` does around the flow when a run is stopped, or continued with ``--resume``.

A stop (SIGTERM or Ctrl-C) is not retried inside a process that is going away: the attempt that
was running is collected and recorded as ``preempted`` (SIGTERM) or ``user_cancelled`` (SIGINT),
the table is printed with how to resume, and the exit code is the conventional 128+N. ``--resume``
first settles whatever the lost attempt left behind, then numbers the next attempt after it and
starts it from the newest valid checkpoint. The judging itself is `trainguard.core.recovery`'s.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from trainguard.cli.output import attempts_table, console, fail, say
from trainguard.core import policy as retry_policy
from trainguard.core import recovery
from trainguard.core.attempt import LINEAGE_TAG, AttemptSummary
from trainguard.core.spec import TrainingSpec
from trainguard.core.backends.base import Backend
from trainguard.core.backends.capabilities import Supervises
from trainguard.core.evidence import verdicts
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.taxonomy import Category

if TYPE_CHECKING:
    from trainguard.core import triage

STOPS = {
    signal.SIGTERM: ("preempted", "trainguard.stop.sigterm", "trainguard run received SIGTERM"),
    signal.SIGINT: ("user_cancelled", "trainguard.stop.sigint", "trainguard run was interrupted (Ctrl-C)"),
}


def resume_command(spec_file: Path | None, run_id: str, backend: str | None = None) -> str:
    """The command line that continues the run, on the backend it ran on."""
    on = f" --backend {backend}" if backend else ""
    return f"trainguard run {spec_file or 'SPEC'} --resume {run_id}{on}"


def _policy(spec: TrainingSpec, blocks: dict[str, Any]) -> retry_policy.RetryPolicy:
    from blocks import resolve_policy

    return resolve_policy(spec, blocks.get("retry_policy"))


def _context(spec: TrainingSpec, blocks: dict[str, Any]) -> tuple[Backend, EvidenceStore, int, triage.RuleSet | None]:
    from blocks import load_backend, load_evidence

    rules = blocks.get("rules")
    return (load_backend(blocks.get("backend")), load_evidence(blocks.get("evidence")), _policy(spec, blocks).max_attempts,
            triage.load_rules(str(rules)) if rules else None)


def _refuse_a_spent_budget(spec: TrainingSpec, blocks: dict[str, Any], run_id: str, history: list[AttemptSummary],
                           checkpoints: list[str]) -> None:
    """Refuse to resume a run whose attempt budget is spent, as the policy would have refused its retry."""
    policy = _policy(spec, blocks)
    spent = retry_policy.budget_spent(policy, [s.record() for s in history], checkpoints)
    if not spent:
        return
    last = history[-1].attempt
    if policy.max_total_attempts is not None and last >= policy.max_total_attempts:
        allow = f"raise retry.max_total_attempts above {last} in the spec (or drop it)"
    else:
        allow = f"--max-attempts {policy.max_attempts + 1} (or retry.max_attempts in the spec)"
    fail(f"--resume: run {run_id} has spent its {spent.removeprefix('attempt budget spent: ')}; "
         f"allow more with {allow}, or start a new run")


stopping = threading.Event()
"""Set once the run is ending (a stop is being recorded, or the flow returned)."""


def stopped(spec: TrainingSpec, run_id: str, blocks: dict[str, Any], signum: int, spec_file: Path | None,
            why: str | None = None) -> None:
    """Stop and record the interrupted attempt, print the table and exit 128+signum.

    ``why`` replaces the signal's own wording when something else ended the run (its server died).
    """
    stopping.set()
    if threading.current_thread() is threading.main_thread():
        for ignored in STOPS:  # a second Ctrl-C must not cut the verdict short
            signal.signal(ignored, signal.SIG_IGN)
    category, rule_id, signature = STOPS.get(signal.Signals(signum), STOPS[signal.SIGTERM])
    signature = why or signature
    how = resume_command(spec_file, run_id, blocks.get("backend"))
    backend, store, max_attempts, rules = _context(spec, blocks)
    attempts = recovery.attempts_of(backend, store, run_id)
    summaries = [s for a in attempts[:-1] if (s := verdicts.read(store, run_id, a))]
    outcome = f"attempt {attempts[-1] if attempts else 1} recorded as {category}"
    if attempts:
        last = verdicts.read(store, run_id, attempts[-1])
        if last is None:  # the attempt that was running: the stop is how it ended
            # whatever the backend (a local process, a Kubernetes Job, a Slurm job), nothing of the
            # attempt may run on once the run has stopped; one the flow already stopped is left as it is
            last = _settle(backend, store, run_id, attempts[-1], max_attempts, spec.total_gpus,
                           f"stopped, not retried here; resume with `{how}`", rules,
                           recovery.Stop(Category(category), rule_id, signature, f"resume with `{how}`"))
        elif last.retried:  # stopped during the backoff: attempt N had ended on its own
            last = recovery.retry_not_made(
                store, last, f"attempt {attempts[-1] + 1} was not started: {signature} during the backoff; "
                f"resume with `{how}`")
            outcome = (f"attempt {last.attempt} keeps its verdict ({last.category or 'unknown'}); "
                       f"attempt {last.attempt + 1} was not started")
        summaries.append(last)
    console.print()
    console.print(attempts_table(summaries, title=f"trainguard run {run_id}"))
    say(f"Stopped: {signature}; {outcome}.")
    say(f"resume with: {how}")
    raise typer.Exit(128 + signum)


def _settle(backend: Backend, store: EvidenceStore, run_id: str, attempt: int, max_attempts: int, gpus: int,
            next_step: str, rules: triage.RuleSet | None, stop: recovery.Stop | None = None) -> AttemptSummary:
    """Recover an attempt no flow judged (`recovery.recover`), saying what was stopped; its verdict as kept.

    ``next_step`` (how to resume) is its decision: a stopped or lost run is not retried here.
    """
    begun = AttemptSummary(run_id=run_id, attempt=attempt, max_attempts=max_attempts,
                           state="Cancelled" if stop is not None else "Crashed", gpus=gpus)
    recovered = recovery.recover(backend, store, begun, source="cli",
                                 judge=stop.judge if stop is not None else recovery.triage_judge(backend, rules),
                                 decide=lambda summary, checkpoints: retry_policy.RetryDecision(False, next_step),
                                 say=say)
    if recovered.stopped:
        say(f"attempt {attempt}: {recovered.stopped}")
    return recovered.summary


def check_resume(spec: TrainingSpec, run_id: str, blocks: dict[str, Any]) -> list[int]:
    """Refuse, in one line, a resume that must not happen; return the run's attempt numbers.

    Not a run that is still alive (its supervisor's pid and start time in ``process.json``), not a
    completed run, not a run whose attempt budget is spent (weighed by the retry policy, as its retry was).
    """
    backend, store, _, _ = _context(spec, blocks)
    try:
        attempts = recovery.attempts_of(backend, store, run_id)
    except ValueError as exc:
        fail(f"--resume: {exc}")
    if not attempts:
        fail(f"--resume: no attempt of run {run_id!r} in the work or evidence folders; check the run id")
    if pid := backend.supervisor_pid(run_id, attempts[-1]) if isinstance(backend, Supervises) else None:
        fail(f"--resume: run {run_id} is still running (attempt {attempts[-1]}, supervised by pid {pid}); "
             f"stop it first (kill -TERM {pid}) or let it finish")
    last = verdicts.read(store, run_id, attempts[-1])
    if last is not None and last.succeeded:
        fail(f"--resume: run {run_id} already completed on attempt {last.attempt}; start a new run without --resume")
    judged = [verdicts.read(store, run_id, a) for a in attempts]
    if all(judged):  # else the budget is weighed once the lost attempts are settled (plan_resume)
        _refuse_a_spent_budget(spec, blocks, run_id, cast(list[AttemptSummary], judged), backend.checkpoints(run_id))
    return attempts


def plan_resume(spec: TrainingSpec, run_id: str, blocks: dict[str, Any], spec_file: Path | None) -> dict[str, Any]:
    """Settle what the lost run left, and say where it continues: {"attempt", "resume_from", "history"}."""
    attempts = check_resume(spec, run_id, blocks)
    backend, store, max_attempts, rules = _context(spec, blocks)
    history: list[AttemptSummary] = []
    for attempt in attempts:
        found = verdicts.read(store, run_id, attempt)
        if found is None:  # the attempt the lost process never judged: stop what it left, collect and classify it now
            found = _settle(backend, store, run_id, attempt, max_attempts, spec.total_gpus,
                            f"continued by `{resume_command(spec_file, run_id, blocks.get('backend'))}`", rules)
        history.append(found)
    if closed := close_lost_flow_runs(run_id):
        say(f"marked {closed} flow run(s) the lost process left running as Crashed")
    checkpoints = backend.checkpoints(run_id)
    _refuse_a_spent_budget(spec, blocks, run_id, history, checkpoints)
    resume_from = checkpoints[0] if checkpoints else None
    say(f"resuming run {run_id} at attempt {attempts[-1] + 1}, from {resume_from or 'the start (no checkpoint)'}")
    return {"attempt": attempts[-1] + 1, "resume_from": resume_from, "history": [s.to_dict() for s in history]}


def close_lost_flow_runs(run_id: str) -> int:
    """Mark the flow runs a killed `trainguard run` left Running as Crashed; return how many.

    They would otherwise stay Running in the UI for good: nothing else ever ends them. The attempt
    runs carry the run's lineage tag; their parent training-run flow run is found through them.
    """
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType, FlowRunFilterTags
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    alive = (StateType.RUNNING, StateType.PENDING)
    message = f"the process running it was lost; run {run_id} was continued with --resume"
    try:
        with get_client(sync_client=True) as client:
            attempts = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[f"{LINEAGE_TAG}:{run_id}"]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(alive)))))
            parents = {client.read_task_run(r.parent_task_run_id).flow_run_id for r in attempts if r.parent_task_run_id}
            lost = [*attempts, *(run for p in parents if p and (run := client.read_flow_run(p)).state_type in alive)]
            for run in lost:
                client.set_flow_run_state(run.id, Crashed(message=message), force=True)
    except Exception as exc:  # the resume goes on; the UI is only less tidy
        say(f"warning: could not mark the lost run's flow runs Crashed: {type(exc).__name__}: {exc}")
        return 0
    return len(lost)
