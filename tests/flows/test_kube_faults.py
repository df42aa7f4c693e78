"""Kubernetes attempts under trouble, through the attempt flow against kubesim: a flow process
killed and run again adopts its Job, API errors and dropped watches change nothing, a Job deleted
mid-attempt still yields evidence and a verdict, and every call stays inside the RBAC manifest.

The GPUs are the only stand-in (kubesim's nodes advertise nvidia.com/gpu)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rbac_check import allowed_by_rbac, calls
from simfixtures import sim_fixture
from kube_helpers import evidence_names, kept, kube_blocks, pod_of, tiny
from flows.attempt import train_attempt
from trainguard.core.spec import parse_spec
from waiting import wait_for

sim = sim_fixture()


@pytest.fixture
def kb(sim: Any, prefect_server: str, tmp_path: Path) -> dict[str, Any]:
    return kube_blocks(sim, tmp_path)


def attempt(spec: dict[str, Any], kb: dict[str, Any], run_id: str) -> Any:
    return train_attempt(parse_spec(spec), attempt=1, run_id=run_id, backend_block=kb["backend_block"],
                         evidence_block=kb["evidence_block"], return_state=True)


def test_a_killed_flow_run_again_adopts_the_running_job_without_a_second_create(
    kb: dict[str, Any], sim: Any, prefect_server: str,
) -> None:
    spec = tiny("k-adopt", "--steps", "40", "--step-seconds", "0.1")
    sim.clear_requests()
    code = ("import sys; from flows.attempt import train_attempt; from trainguard.core.spec import parse_spec; "
            f"train_attempt(parse_spec({spec!r}), attempt=1, run_id='k-adopt-1', "
            f"backend_block={kb['backend_block']!r}, evidence_block={kb['evidence_block']!r})")
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": os.pathsep.join(sys.path)}
    first = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: pod_of(kb["api"], kb["namespace"], "k-adopt-1", 1), timeout=120, what="attempt 1 running")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    state = attempt(spec, kb, "k-adopt-1")
    assert state.is_completed(), state.message
    creates = sim.requests(verb="create", resource="jobs", namespace=kb["namespace"])
    assert [c["code"] for c in creates] == [201, 409]
    assert "training finished at step 40" in kept(kb["evidence"], "k-adopt-1", 1, next(
        n for n in evidence_names(kb["evidence"], "k-adopt-1", 1) if n.endswith("/logs/train.log")))
    assert calls(sim, kb["namespace"]) <= allowed_by_rbac(kb["namespace"])


def test_api_errors_and_dropped_watches_change_nothing_and_calls_stay_within_rbac(
    kb: dict[str, Any], sim: Any,
) -> None:
    ns = kb["namespace"]
    sim.clear_requests()
    rules = {sim.faults.add(verb="list", resource="pods", namespace=ns, status=503, times=2): 2,
             sim.faults.add(verb="create", resource="jobs", namespace=ns, status=500, times=1): 1,
             sim.faults.add(verb="watch", resource="pods", namespace=ns, watch="reset", times=2): 2,
             sim.faults.add(verb="watch", resource="jobs", namespace=ns, watch="expired", times=1): 1}
    try:
        state = attempt(tiny("k-faults", "--fail-at-step", "20", "--checkpoint-every", "10"), kb, "k-faults-1")
    finally:
        sim.faults.clear()
    assert state.is_failed() and "nccl_error" in state.message and "retryable" in state.message
    verdict = kept(kb["evidence"], "k-faults-1", 1, "verdict.json")
    assert (verdict["category"], verdict["decision"]["retry"]) == ("nccl_error", True)
    fired = Counter(r["fault"] for r in sim.requests(namespace=ns) if r.get("fault"))
    assert fired == rules  # every rule fired as often as it was set: the outcome above came through them
    made = calls(sim, ns)
    assert {(ns, "jobs", "watch"), (ns, "pods", "watch"), (ns, "pods/log", "get"), (ns, "events", "list"),
            ("default", "events", "list"), (None, "nodes", "get")} <= made  # node events live in `default`
    assert made <= allowed_by_rbac(ns), made - allowed_by_rbac(ns)


def test_a_job_deleted_mid_attempt_still_yields_evidence_and_a_verdict(kb: dict[str, Any], sim: Any) -> None:
    import threading

    box: list[Any] = []
    spec = tiny("k-deleted", "--steps", "400", "--step-seconds", "0.05")
    thread = threading.Thread(target=lambda: box.append(attempt(spec, kb, "k-deleted-1")), daemon=True)
    thread.start()
    pod = wait_for(lambda: pod_of(kb["api"], kb["namespace"], "k-deleted-1", 1), timeout=60, what="the pod running")
    # well past step 10, so the flow's own log follower, which runs behind the pod on a loaded machine, has it
    wait_for(lambda: b"step 60/" in kb["api"].read_pod_log(kb["namespace"], pod, "train"), timeout=60,
             what="training under way")
    kb["api"].delete_job(kb["namespace"], "tg-k-deleted-1-a1")
    thread.join(120)
    state = box[0]
    assert state.is_failed()
    names = evidence_names(kb["evidence"], "k-deleted-1", 1)
    assert "manifest.json" in names and "kubernetes/outcome.json" in names
    outcome = kept(kb["evidence"], "k-deleted-1", 1, "kubernetes/outcome.json")
    assert "step 10/" in outcome["log_tail"]
    verdict = kept(kb["evidence"], "k-deleted-1", 1, "verdict.json")
    assert (verdict["category"], verdict["rule_id"], verdict["termination_reason"]) == (
        "user_cancelled", "reason.cancelled", "JobDeleted")  # someone stopped it: not retried against them
    assert verdict["decision"]["retry"] is False
    missing = {m["name"]: m["reason"] for m in kept(kb["evidence"], "k-deleted-1", 1, "manifest.json")["missing"]}
    assert "is gone: deleted" in missing["kubernetes/job.json"]
    pods = [name for name in missing if name.startswith("kubernetes/pods/tg-k-deleted-1-a1-")]
    assert pods and all("is gone" in missing[name] and "its logs went with it" in missing[name] for name in pods)
    assert "no pod of the Job is left" in missing["termination-message.txt"]


def test_a_dead_attempts_running_job_is_deleted_after_its_evidence_is_kept_and_retried_once(
    kb: dict[str, Any], sim: Any,
) -> None:
    from datetime import datetime, timedelta, timezone

    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Crashed, Running

    from blocks import load_backend
    from flows.controller import retry_controller
    from runs import attempt_runs
    from trainguard.core.backends.base import Launch
    from trainguard.core.backends.kubernetes import manifests

    ns, job_name = kb["namespace"], "tg-k-orphan-1-a1"
    # The spec names its backend and no parameter does: recovery must find the Job through the spec.
    spec = {**tiny("k-orphan", "--steps", "2000", "--step-seconds", "0.05"), "backend": kb["backend_block"]}
    train_attempt.to_deployment(name="kube-orphans").apply()
    # Scheduled an hour ahead so nothing runs it: its flow process is as dead as a SIGKILLed one.
    run = run_deployment("train-attempt/kube-orphans", timeout=0, tags=["trainguard-run:k-orphan-1"],
                         scheduled_time=datetime.now(timezone.utc) + timedelta(hours=1), parameters={
                             "spec": spec, "run_id": "k-orphan-1", "evidence_block": kb["evidence_block"]})
    # ... and the Job that flow process created before it died, still training.
    backend: Any = load_backend(kb["backend_block"])
    ref = backend.provision("k-orphan-1", 1)
    launch = Launch(run_id="k-orphan-1", attempt=1, command=tuple(spec["command"]), gpus=1)
    kb["api"].create_job(ns, manifests.job_manifest(backend.settings.job, launch, ref.details["config_map"]))
    pod = wait_for(lambda: pod_of(kb["api"], ns, "k-orphan-1", 1), timeout=60, what="the orphan's pod running")
    wait_for(lambda: b"step 10/" in kb["api"].read_pod_log(ns, pod, "train"), timeout=30, what="training under way")
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Running(), force=True)
        client.set_flow_run_state(run.id, Crashed(message="the flow pod's node was lost"), force=True)
    sim.clear_requests()

    first = retry_controller(str(run.id))
    successors = [r for r in attempt_runs("k-orphan-1") if r.parameters.get("attempt") == 2]
    assert [str(r.id) for r in successors] == [first["next_flow_run_id"]]
    assert successors[0].parameters.get("backend_block") is None and successors[0].parameters["spec"]["backend"]
    log = kept(kb["evidence"], "k-orphan-1", 1, f"kubernetes/pods/{pod}/logs/train.log")
    assert "step 10/" in log
    requests = sim.requests(namespace=ns)
    deletes = [i for i, r in enumerate(requests) if r["verb"] == "delete" and r["resource"] == "jobs"]
    reads = [i for i, r in enumerate(requests) if r.get("subresource") == "log" and r.get("name") == pod]
    assert len(deletes) == 1 and requests[deletes[0]]["name"] == job_name and requests[deletes[0]]["code"] == 200
    assert reads and max(reads) < deletes[0], "the evidence is read before the Job is deleted"
    wait_for(lambda: not kb["api"].list_jobs(ns, manifests.selector("k-orphan-1", 1))["items"], timeout=30,
             what="the orphaned Job gone")
    verdict = kept(kb["evidence"], "k-orphan-1", 1, "verdict.json")
    assert verdict["state"] == "Crashed" and verdict["decision"]["retry"] is True
