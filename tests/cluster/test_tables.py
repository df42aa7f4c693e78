"""The printPod/printJob ports behind `kubectl get`: STATUS and RESTARTS cells for the states the
classifier cares about, and the apiserver's human durations."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kubesim import tables
from kubesim.store import timestamp


def _pod(statuses: list[dict[str, Any]], *, phase: str = "Running", deleting: bool = False,
         reason: str | None = None, inits: list[dict[str, Any]] | None = None,
         ready: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "creationTimestamp": timestamp()}
    if deleting:
        meta["deletionTimestamp"] = timestamp()
    status: dict[str, Any] = {"phase": phase, "containerStatuses": statuses,
                              "conditions": [{"type": "Ready",
                                              "status": "True" if ready else "False"}]}
    if reason:
        status["reason"] = reason
    spec: dict[str, Any] = {"containers": [{"name": s["name"]} for s in statuses]}
    if inits is not None:
        status["initContainerStatuses"] = inits
        spec["initContainers"] = [{"name": s["name"]} for s in inits]
    return {"metadata": meta, "spec": spec, "status": status}


def _c(name: str, state: dict[str, Any], restarts: int = 0, ready: bool = False,
       last: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "state": state, "restartCount": restarts, "ready": ready,
            "lastState": {"terminated": last} if last else {}}


RUNNING = {"running": {"startedAt": "2025-06-01T10:00:00Z"}}


@pytest.mark.parametrize(("pod", "status"), [
    (_pod([_c("a", {"waiting": {"reason": "CrashLoopBackOff"}})]), "CrashLoopBackOff"),
    (_pod([_c("a", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})],
          phase="Failed"), "OOMKilled"),
    (_pod([_c("a", {"terminated": {"exitCode": 139, "signal": 11}})], phase="Failed"),
     "Signal:11"),
    (_pod([_c("a", {"terminated": {"exitCode": 3}})], phase="Failed"), "ExitCode:3"),
    (_pod([_c("a", RUNNING, ready=True)], deleting=True), "Terminating"),
    (_pod([_c("a", RUNNING, ready=True)], deleting=True, reason="NodeLost"), "Unknown"),
    (_pod([], phase="Failed", reason="Evicted"), "Evicted"),
    (_pod([_c("a", RUNNING, ready=True),
           _c("b", {"terminated": {"exitCode": 0, "reason": "Completed"}})], ready=True),
     "Running"),
    (_pod([_c("a", {"waiting": {"reason": "PodInitializing"}})], phase="Pending",
          inits=[_c("init", {"waiting": {"reason": "ErrImagePull"}})]), "Init:ErrImagePull"),
    (_pod([_c("a", {"waiting": {"reason": "PodInitializing"}})], phase="Pending",
          inits=[_c("init", RUNNING)]), "Init:0/1"),
])
def test_pod_status_cell_follows_print_pod(pod: dict[str, Any], status: str) -> None:
    assert tables.table("pods", [pod], "1")["rows"][0]["cells"][2] == status


def test_restarts_cell_shows_the_age_of_the_newest_termination() -> None:
    finished = timestamp(time.time() - 125)
    pod = _pod([_c("a", RUNNING, restarts=3, ready=True,
                   last={"exitCode": 1, "finishedAt": finished})], ready=True)
    cells = tables.table("pods", [pod], "1")["rows"][0]["cells"]
    assert cells[1] == "1/1" and cells[3] == "3 (2m5s ago)"


def _with_sidecar(inits: list[dict[str, Any]], *, initialized: bool) -> dict[str, Any]:
    """A pod whose first init container is a native sidecar (restartPolicy Always)."""
    pod = _pod([_c("train", RUNNING, ready=True)] if initialized else
               [_c("train", {"waiting": {"reason": "PodInitializing"}})],
               phase="Running" if initialized else "Pending", inits=inits, ready=initialized)
    pod["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    pod["status"]["conditions"].append({"type": "Initialized",
                                        "status": "True" if initialized else "False"})
    return pod


def test_a_started_sidecar_counts_as_a_ready_container_with_its_restarts() -> None:
    finished = timestamp(time.time() - 65)
    sidecar = {**_c("shipper", RUNNING, restarts=2, ready=True,
                    last={"exitCode": 1, "finishedAt": finished}), "started": True}
    cells = tables.table("pods", [_with_sidecar([sidecar], initialized=True)], "1")["rows"][0]["cells"]
    assert cells[1:4] == ["2/2", "Running", "2 (65s ago)"]
    # before the pod is initialized, a started sidecar lets the next init container's turn show
    waiting = _c("fetch", {"running": {"startedAt": finished}})
    cells = tables.table("pods", [_with_sidecar([sidecar, waiting], initialized=False)],
                         "1")["rows"][0]["cells"]
    assert cells[1:3] == ["1/2", "Init:1/2"]


@pytest.mark.parametrize(("seconds", "text"), [
    (5, "5s"), (119, "119s"), (125, "2m5s"), (600, "10m"), (3 * 3600 + 60, "3h1m"),
    (30 * 3600, "30h"), (3 * 86400 + 3600, "3d1h"), (400 * 86400, "400d"),
])
def test_human_duration_matches_the_apiserver(seconds: int, text: str) -> None:
    assert tables.human_duration(seconds) == text


@pytest.mark.parametrize(("conditions", "deleting", "cell"), [
    ([{"type": "Complete", "status": "True"}], False, "Complete"),
    ([{"type": "FailureTarget", "status": "True"}], False, "FailureTarget"),
    ([{"type": "FailureTarget", "status": "True"}, {"type": "Failed", "status": "True"}],
     False, "Failed"),
    ([], True, "Terminating"),
    ([], False, "Running"),
])
def test_job_status_cell_follows_print_job(conditions: list[dict[str, str]], deleting: bool,
                                           cell: str) -> None:
    meta: dict[str, Any] = {"name": "j", "creationTimestamp": timestamp()}
    if deleting:
        meta["deletionTimestamp"] = timestamp()
    job = {"metadata": meta, "spec": {"completions": 1},
           "status": {"conditions": conditions, "succeeded": 0}}
    cells = tables.table("jobs", [job], "1")["rows"][0]["cells"]
    assert cells[1] == cell and cells[2] == "0/1"


def test_aggregated_event_shows_count_over_first_seen() -> None:
    event = {"metadata": {"name": "e"}, "type": "Warning", "reason": "BackOff", "count": 5,
             "firstTimestamp": timestamp(time.time() - 120), "lastTimestamp": timestamp(),
             "involvedObject": {"kind": "Pod", "name": "p"}, "message": "Back-off "}
    cells = tables.table("events", [event], "1")["rows"][0]["cells"]
    assert cells[0] == "0s (x5 over 2m)" and cells[3] == "pod/p" and cells[6] == "Back-off"
