"""Twelve runs at once through two process workers on a PostgreSQL-backed server, with API faults.

The runs mix every outcome: success, retry then success, a non-retryable failure, a spent budget,
and a flow process SIGKILLed mid-attempt. Workers and flow runs reach the server through a proxy that
answers some requests with 502/503, drops some connections, and loses the answer to some requests
that create flow runs after the server acted on them. Every lineage must still be complete: the
right attempts in the right states, no attempt scheduled twice, and every manifest verifying.
"""

from __future__ import annotations

import os
import re
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prefect import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.deployments import run_deployment
from scale_helpers import POOL, ROOT, attempt_runs, tiny_spec
from waiting import wait_for

from blocks import EvidenceFolder, LocalProcessBackend
from services.faulty_proxy import FaultPlan, faulty_proxy
from services.prefect_server import process_workers
from trainguard.core.evidence.manifest import read_manifest, verify_manifest
from trainguard.core.stores.folder import LocalEvidenceStore

HOOK_DONE = "Hook 'schedule_next_attempt' finished running successfully"
ALWAYS_KEPT = {"crash-report.json", "checkpoints.json", "snapshot/env.json"}


@dataclass(frozen=True)
class Case:
    """One run: its trainer arguments and the attempts it must end with."""

    run_id: str
    args: tuple[str, ...]
    states: tuple[str, ...]
    categories: tuple[str | None, ...]
    retry: dict = field(default_factory=dict)
    killed: bool = False  # attempt 1 hangs and its flow process is SIGKILLed

    def spec(self) -> dict:
        return tiny_spec(self.run_id.rsplit("-", 1)[0], *self.args, retry=self.retry, stall_seconds=300)


FLAKY = ("--fail-at-step", "25", "--fail-on-attempt", "1")
CODE_ERROR = ("--fail-after-steps", "3", "--failure", "type-error")
HANG = ("--fail-after-steps", "12", "--failure", "hang", "--fail-on-attempt", "1")
CASES = [
    *(Case(f"ok-{i}", (), ("Completed",), (None,)) for i in (1, 2, 3)),
    *(Case(f"flaky-{i}", FLAKY, ("Failed", "Completed"), ("nccl_error", None)) for i in (1, 2, 3)),
    *(Case(f"code-{i}", CODE_ERROR, ("Failed",), ("code_error",)) for i in (1, 2)),
    # A budget of two: the longest lineage here, so each attempt more would lengthen the whole test.
    *(Case(f"budget-{i}", ("--fail-after-steps", "15", "--checkpoint-every", "100"), ("Failed",) * 2, ("nccl_error",) * 2,
           retry={"max_attempts": 2, "same_signature_limit": 0}) for i in (1, 2)),
    *(Case(f"killed-{i}", HANG, ("Crashed", "Completed"), (None, None), killed=True) for i in (1, 2)),
]


@pytest.fixture
def scale_blocks(pg_server, tmp_path) -> dict:
    suffix = uuid.uuid4().hex[:8]
    LocalProcessBackend(work_root=str(tmp_path / "work"), grace_seconds=2).save(f"scale-backend-{suffix}")
    EvidenceFolder(root=str(tmp_path / "evidence")).save(f"scale-evidence-{suffix}")
    return {"backend_block": f"trainguard-local-process-backend/scale-backend-{suffix}",
            "evidence_block": f"scale-evidence-{suffix}", "work": tmp_path / "work", "evidence": tmp_path / "evidence"}


@pytest.mark.timeout(900)
def test_twelve_concurrent_runs_through_two_workers_keep_every_lineage_complete_despite_api_faults(
    pg_server, attempt_deployment, scale_blocks, tmp_path
):
    plan = FaultPlan(first_creates=("server-error", "late-error", "lost-answer"))  # then at random
    with faulty_proxy(pg_server.api_url.removesuffix("/api"), plan) as proxy, \
            process_workers(2, POOL, f"{proxy}/api", tmp_path / "workers", ROOT, limit=5,
                            TRAINGUARD_PROJECT_DIR=str(ROOT)) as workers:
        for case in CASES:
            run_deployment(attempt_deployment, timeout=0, tags=[f"trainguard-run:{case.run_id}"], parameters={
                "spec": case.spec(), "run_id": case.run_id, "backend_block": scale_blocks["backend_block"],
                "evidence_block": scale_blocks["evidence_block"]})
        for case in CASES:
            if case.killed:
                sigkill_flow_process(scale_blocks["work"], case.run_id)
        try:
            for case in CASES:
                wait_for(lambda: lineage_settled(case), 600, lambda: where_runs_are(tmp_path / "workers"))
        finally:
            plan.enabled = False
        assert all(w.poll() is None for w in workers), "a worker died"

    assert all(plan.counts[kind] for kind in ("error", "drop", "server-error", "late-error", "lost-answer")), plan.counts
    store = LocalEvidenceStore(scale_blocks["evidence"])
    for case in CASES:
        check_lineage(case, store)


def lineage_settled(case: Case) -> bool:
    """All of the case's attempts exist and are final, and the last one's hook (if any) has finished."""
    runs = attempt_runs(case.run_id)
    if len(runs) < len(case.states) or not all(r.state and r.state.is_final() for r in runs):
        return False
    last = runs[-1]
    return last.state.is_completed() or hook_finished(last.id)


def where_runs_are(workers: Path) -> str:
    """Every lineage's attempts and states, and the workers' last lines: what a timed-out wait needs to say."""
    lineages = "; ".join(f"{case.run_id}: " + ", ".join(f"{r.parameters.get('attempt', 1)} {r.state and r.state.name}"
                                                         for r in attempt_runs(case.run_id)) for case in CASES)
    tails = "\n".join(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                      for log in sorted(workers.glob("*.log")))
    return f"every lineage to settle: {lineages}\n{tails}"


def hook_finished(flow_run_id) -> bool:
    """Whether the retry hook of `flow_run_id` has run to its end (Prefect logs it to the API)."""
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return any(HOOK_DONE in log.message for log in logs)


def check_lineage(case: Case, store: LocalEvidenceStore) -> None:
    runs = attempt_runs(case.run_id)
    summary = [(r.parameters.get("attempt", 1), r.state.type.value.title()) for r in runs]
    assert summary == list(enumerate(case.states, start=1)), f"{case.run_id}: {summary}"
    for earlier, later in zip(runs, runs[1:]):
        assert later.parameters["parent_flow_run_id"] == str(earlier.id), case.run_id
        assert later.idempotency_key == f"next-attempt-of-{earlier.id}", case.run_id
    for run, category in zip(runs, case.categories):
        if category:
            assert category in (run.state.message or ""), f"{case.run_id}: {run.state.message}"
    for attempt, run in enumerate(runs, start=1):
        if case.killed and attempt == 1:
            continue  # SIGKILL left no `finally` to run; the worker reported the crash instead
        manifest = read_manifest(store, case.run_id, attempt)
        names = {item.name for item in manifest.items}
        assert ALWAYS_KEPT <= names and any(n.startswith("logs/") for n in names), f"{case.run_id}/{attempt}: {names}"
        assert verify_manifest(store, manifest) == [], f"{case.run_id}/{attempt}"
    if case.killed:  # the worker saw the process die; the hook judged it as terminated from outside
        assert runs[1].parameters["history"][0]["category"] == "preempted", case.run_id
        assert runs[1].parameters["resume_from"].endswith("step-000010.json"), case.run_id


def sigkill_flow_process(work: Path, run_id: str) -> None:
    """Wait for attempt 1 to hang, then SIGKILL its flow process, and the orphans it leaves."""
    log = work / "runs" / run_id / "attempt-1" / "logs" / f"train-{run_id}-attempt-1.log"
    wait_for(lambda: log.exists() and b"injecting failure 'hang'" in log.read_bytes(), 300, f"{run_id} to hang")
    trainer = int(re.search(rb"pid (\d+)", log.read_bytes()).group(1))
    entrypoint = parent_pid(trainer)
    flow_process = parent_pid(entrypoint)  # trainer <- container entrypoint <- the flow run's engine
    assert b"python" in Path(f"/proc/{flow_process}/cmdline").read_bytes()
    os.kill(flow_process, signal.SIGKILL)
    for orphan in (entrypoint, trainer):  # a lost machine takes its processes with it
        try:
            os.kill(orphan, signal.SIGKILL)
        except ProcessLookupError:
            pass


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])
