"""KubeApi against kubesim: wire-form answers, the error tree at the edge, retries of transient
errors only, logs as bytes, and watches that end in a translated error."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

import kubesim.fixture
from trainguard.core.backends.kubernetes import errors
from trainguard.core.backends.kubernetes.api import KubeApi, RetrySettings
from trainguard.core.backends.kubernetes.watch import RELISTED, ResumingWatch
from waiting import wait_for


def job(name: str, command: list[str]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "python:3.11", "command": command}]}}}}


def test_create_read_delete_job_in_wire_form(kube: KubeApi, ns: str) -> None:
    created = kube.create_job(ns, job("j1", ["python", "-c", "print('hi')"]))
    assert created["metadata"]["uid"] and created["spec"]["backoffLimit"] == 0
    assert kube.read_job(ns, "j1")["metadata"]["name"] == "j1"
    assert [j["metadata"]["name"] for j in kube.list_jobs(ns, "app=j1")["items"]] == ["j1"]
    kube.delete_job(ns, "j1")
    wait_for(lambda: not kube.list_jobs(ns)["items"], what="the job gone")


@pytest.mark.parametrize(("status", "error"), [
    (404, errors.NotFound), (409, errors.Conflict), (403, errors.Forbidden), (410, errors.Expired),
    (422, errors.Invalid),
])
def test_statuses_become_their_error_and_are_not_retried(
    kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, status: int, error: type[Exception],
) -> None:
    sim.faults.add(verb="get", resource="jobs", namespace=ns, name="x", status=status)
    with pytest.raises(error) as caught:
        kube.read_job(ns, "x")
    assert caught.value.__cause__ is not None and f"read job {ns}/x" in str(caught.value)
    assert len(sim.requests(verb="get", namespace=ns, name="x")) == 1


@pytest.mark.parametrize("status", [429, 500, 503, 504])
def test_transient_statuses_are_retried_with_backoff(sim: kubesim.fixture.Sim, ns: str, status: int) -> None:
    slept: list[float] = []
    api = KubeApi.from_kubeconfig(str(sim.kubeconfig), retry=RetrySettings(attempts=4), sleep=slept.append)
    sim.faults.add(verb="list", resource="pods", namespace=ns, status=status, times=2)
    assert api.list_pods(ns)["items"] == []
    assert slept == [0.2, 0.4]
    assert [r["code"] for r in sim.requests(verb="list", namespace=ns)] == [status, status, 200]


def test_transient_errors_give_up_after_the_budget(sim: kubesim.fixture.Sim, ns: str) -> None:
    api = KubeApi.from_kubeconfig(str(sim.kubeconfig), retry=RetrySettings(attempts=3), sleep=lambda _: None)
    sim.faults.add(verb="list", resource="pods", namespace=ns, status=503)
    with pytest.raises(errors.Transient, match="503"):
        api.list_pods(ns)
    assert len(sim.requests(verb="list", namespace=ns)) == 3


def test_an_unreachable_server_is_transient(kube: KubeApi) -> None:
    api = KubeApi.from_config_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}],
    }, retry=RetrySettings(attempts=2), sleep=lambda _: None)
    with pytest.raises(errors.Transient):
        api.read_node("gpu-node-1")


def test_a_missing_kubeconfig_is_one_line_naming_it(tmp_path: Any) -> None:
    with pytest.raises(errors.KubeError, match="kubeconfig .*missing"):
        KubeApi.from_kubeconfig(str(tmp_path / "missing"))


def test_logs_come_back_as_bytes_and_stream(kube: KubeApi, ns: str) -> None:
    script = "import sys; sys.stdout.buffer.write(b'ok\\n\\xff\\xfe not utf-8\\n')"
    kube.create_job(ns, job("logs", ["python", "-c", script]))
    pod = wait_for(lambda: next(iter(kube.list_pods(ns, "app=logs")["items"]), None), what="the pod")
    name = pod["metadata"]["name"]
    wait_for(lambda: kube.read_pod(ns, name)["status"].get("phase") == "Succeeded", what="the pod done")
    log = kube.read_pod_log(ns, name, "main")
    assert isinstance(log, bytes) and log.startswith(b"ok\n") and log.endswith(b" not utf-8\n")
    assert b"".join(kube.stream_pod_log(ns, name, "main")) == log
    with pytest.raises(errors.Invalid):
        kube.read_pod_log(ns, name, "main", previous=True)


def test_a_config_map_created_twice_is_a_conflict_the_second_time(kube: KubeApi, ns: str) -> None:
    created = kube.create_config_map(ns, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    assert created["data"] == {"a": "1"}
    with pytest.raises(errors.Conflict):
        kube.create_config_map(ns, {"metadata": {"name": "cm"}, "data": {"a": "2"}})


def test_resuming_watch_survives_a_reset_and_a_410(kube: KubeApi, sim: kubesim.fixture.Sim, ns: str) -> None:
    watch = ResumingWatch(kube, "jobs", ns, "app=w", timeout_seconds=5, sleep=lambda _: None)
    events = iter(watch)
    assert next(events)["type"] == RELISTED
    sim.faults.add(verb="watch", resource="jobs", namespace=ns, watch="reset", times=1)
    sim.faults.add(verb="watch", resource="jobs", namespace=ns, watch="expired", times=1)
    kube.create_job(ns, job("w", ["python", "-c", "pass"]))
    done = wait_for(lambda: _terminal(next(events)), timeout=30, what="the job complete through the watch")
    assert done["metadata"]["name"] == "w"
    # The reset always comes first; whether the 410 is met before the Job's end is delivered depends
    # on when the Job finishes, but every 410 that is met must be followed by a fresh list.
    assert watch.stats.drops == 1 and watch.stats.expired <= 1
    assert watch.stats.lists == 1 + watch.stats.expired


def _terminal(event: dict[str, Any]) -> dict[str, Any] | None:
    objects = event["object"].get("items") if event["type"] == RELISTED else [event["object"]]
    for obj in objects or ():
        if any(c["type"] == "Complete" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", [])):
            return dict(obj)
    return None


def test_many_calls_at_once_keep_their_connections_without_a_warning(
    sim: kubesim.fixture.Sim, ns: str, caplog: pytest.LogCaptureFixture,
) -> None:
    # A 16-node attempt follows 16 pods' logs at once beside its watch and calls. urllib3 sizes its pool
    # by the flow host's cores (10 on 2 cores) and warns at every connection it must drop beyond that.
    api = KubeApi.from_kubeconfig(str(sim.kubeconfig))
    sim.faults.add(verb="list", resource="pods", namespace=ns, delay=1.0)  # so that all 16 are open at once
    start = threading.Barrier(16)

    def call() -> None:
        start.wait()
        api.list_pods(ns)

    callers = [threading.Thread(target=call) for _ in range(16)]
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
    api.close()
    assert len(sim.requests(verb="list", namespace=ns)) == 16
    assert not [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]
