"""Watch streams and the pods/log subresource, judged by the official kubernetes client.

Pods here are seeded (no scheduler or kubelet touches them); the tests write status and CRI log
files the way a kubelet would, so only the API's behaviour is under test.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from cluster_helpers import read_log, seeded_pod, write_cri_log
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kubesim import logs


def _collect(core: client.CoreV1Api, ns: str, seconds: int, started: threading.Event | None = None,
             **kwargs: Any) -> list[tuple[str, str]]:
    """Every event of one watch; `started` is set once the watch has delivered its first."""
    events = []
    for event in watch.Watch().stream(core.list_namespaced_pod, ns, timeout_seconds=seconds,
                                      **kwargs):
        events.append((event["type"], event["object"].metadata.name))
        if started is not None:
            started.set()
    return events


def _once_watching(started: threading.Event, change: Any) -> None:
    """Make the changes once the watch is open, however long opening it takes on a busy box."""
    def run() -> None:
        if started.wait(timeout=10):
            change()

    threading.Thread(target=run).start()


def test_watch_sends_current_objects_then_live_changes(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("before"))

    def later() -> None:
        core.create_namespaced_pod(ns, seeded_pod("after"))
        core.delete_namespaced_pod("after", ns)

    started = threading.Event()
    _once_watching(started, later)
    events = _collect(core, ns, 2, started)
    assert events == [("ADDED", "before"), ("ADDED", "after"), ("DELETED", "after")]


def test_watch_turns_selector_transitions_into_added_and_deleted(core: client.CoreV1Api,
                                                                ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p", labels={"app": "x"}))

    def relabel() -> None:
        core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"app": "y"}}})
        core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"app": "x"}}})

    started = threading.Event()
    _once_watching(started, relabel)
    events = _collect(core, ns, 2, started, label_selector="app=x")
    assert events == [("ADDED", "p"), ("DELETED", "p"), ("ADDED", "p")]


def test_watch_resumes_from_a_resource_version(core: client.CoreV1Api, ns: str) -> None:
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    core.create_namespaced_pod(ns, seeded_pod("a"))
    core.patch_namespaced_pod("a", ns, {"metadata": {"labels": {"x": "1"}}})
    events = _collect(core, ns, 1, resource_version=rv)
    assert events == [("ADDED", "a"), ("MODIFIED", "a")]


def test_watch_from_a_compacted_resource_version_raises_410(sim: Any, core: client.CoreV1Api,
                                                            ns: str) -> None:
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    core.create_namespaced_pod(ns, seeded_pod("a"))
    sim.compact()
    with pytest.raises(ApiException) as err:
        _collect(core, ns, 1, resource_version=rv)
    assert err.value.status == 410 and "too old resource version" in err.value.reason


def test_watch_bookmarks_carry_the_current_resource_version(api_client: client.ApiClient,
                                                            ns: str) -> None:
    response = api_client.call_api(
        f"/api/v1/namespaces/{ns}/pods", "GET",
        query_params=[("watch", "true"), ("allowWatchBookmarks", "true"),
                      ("timeoutSeconds", "2")],
        auth_settings=["BearerToken"], _preload_content=False)
    lines = [line for line in response.data.decode().splitlines() if line]
    assert lines and all('"type":"BOOKMARK"' in line for line in lines)


def _running_with_restart(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any]:
    core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running",
                                                           "containerStatuses": [{
        "name": "main", "image": "python:3.11", "imageID": "", "ready": True, "restartCount": 1,
        "state": {"running": {"startedAt": "2025-06-01T10:01:00Z"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                     "startedAt": "2025-06-01T10:00:00Z",
                                     "finishedAt": "2025-06-01T10:00:59Z"}}}]}})
    return core.api_client.sanitize_for_serialization(  # type: ignore[no-any-return]
        core.read_namespaced_pod(name, ns))


def test_logs_read_current_and_previous_instances(sim: Any, core: client.CoreV1Api,
                                                  ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    pod = _running_with_restart(core, ns, "p")
    write_cri_log(sim, pod, "main", 0, [("2025-06-01T10:00:01.000000001Z", "stdout", "first"),
                                        ("2025-06-01T10:00:58.5Z", "stderr", "boom")])
    write_cri_log(sim, pod, "main", 1, [("2025-06-01T10:01:01Z", "stdout", "again")])
    assert read_log(core, "p", ns) == "again\n"
    assert read_log(core, "p", ns, previous=True) == "first\nboom\n"
    assert read_log(core, "p", ns, previous=True, tail_lines=1) == "boom\n"
    assert read_log(core, "p", ns, previous=True, limit_bytes=3) == "fir"
    stamped = read_log(core, "p", ns, previous=True, timestamps=True)
    assert stamped.splitlines()[1] == "2025-06-01T10:00:58.5Z boom"


def test_a_container_in_crash_loop_back_off_serves_the_crashed_run_as_current_and_previous(
        sim: Any, core: client.CoreV1Api, ns: str) -> None:
    # validateContainerLogStatus: with no running or terminated instance, the last terminated
    # one answers both the plain and the --previous read.
    core.create_namespaced_pod(ns, seeded_pod("p"))
    core.patch_namespaced_pod_status("p", ns, {"status": {"phase": "Running",
                                                          "containerStatuses": [{
        "name": "main", "image": "python:3.11", "imageID": "", "ready": False, "restartCount": 2,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                     "containerID": "kubesim://b"}}}]}})
    pod = core.api_client.sanitize_for_serialization(core.read_namespaced_pod("p", ns))
    write_cri_log(sim, pod, "main", 0, [("2025-06-01T10:00:01Z", "stdout", "attempt 1")])
    write_cri_log(sim, pod, "main", 1, [("2025-06-01T10:00:11Z", "stdout", "attempt 2")])
    assert read_log(core, "p", ns) == "attempt 2\n"
    assert read_log(core, "p", ns, previous=True) == "attempt 2\n"
    assert read_log(core, "p", ns, follow=True, _request_timeout=5) == "attempt 2\n"


def _waiting(reason: str) -> dict[str, Any]:
    return {"state": {"waiting": {"reason": reason}}}


@pytest.mark.parametrize(("status", "message"), [
    (_waiting("ContainerCreating"), "is waiting to start: ContainerCreating"),
    (_waiting("ErrImagePull"), "is waiting to start: image can't be pulled"),
    (_waiting("ImagePullBackOff"), "is waiting to start: trying and failing to pull image"),
    (_waiting("CreateContainerConfigError"), "is waiting to start: CreateContainerConfigError"),
    ({"state": {"terminated": {"exitCode": 128, "reason": "StartError"}}}, "is terminated"),
    ({"state": {}}, "is waiting to start - no logs yet"),
    (None, "is not available"),
])
def test_log_of_a_container_that_never_ran_answers_with_the_kubelet_wording(
        core: client.CoreV1Api, ns: str, status: dict[str, Any] | None, message: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    if status is not None:
        core.patch_namespaced_pod_status("p", ns, {"status": {"containerStatuses": [{
            "name": "main", "image": "python:3.11", "imageID": "", "ready": False,
            "restartCount": 0, **status}]}})
    with pytest.raises(ApiException) as err:
        read_log(core, "p", ns)
    assert err.value.status == 400
    assert json.loads(err.value.body)["message"] == f'container "main" in pod "p" {message}'


@pytest.mark.parametrize(("containers", "kwargs", "message"), [
    (("main",), {"previous": True}, 'previous terminated container "main" in pod "p" not found'),
    (("main",), {}, 'container "main" in pod "p" is waiting to start: ContainerCreating'),
    (("a", "b"), {}, "a container name must be specified for pod p, choose one of: [a b]"),
    (("main",), {"container": "zzz"}, "container zzz is not valid for pod p"),
])
def test_log_errors_use_the_kubelet_messages(core: client.CoreV1Api, ns: str,
                                             containers: tuple[str, ...], kwargs: Any,
                                             message: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p", containers=containers))
    core.patch_namespaced_pod_status("p", ns, {"status": {"containerStatuses": [{
        "name": c, "image": "python:3.11", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ContainerCreating"}}} for c in containers]}})
    with pytest.raises(ApiException) as err:
        read_log(core, "p", ns, **kwargs)
    assert err.value.status == 400
    assert json.loads(err.value.body)["message"] == message


def test_log_follow_streams_until_the_container_terminates(sim: Any, core: client.CoreV1Api,
                                                          ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    pod = _running_with_restart(core, ns, "p")
    path = write_cri_log(sim, pod, "main", 1, [("2025-06-01T10:01:01Z", "stdout", "one")])

    def finish() -> None:
        time.sleep(0.3)
        with path.open("a") as fh:
            fh.write("2025-06-01T10:01:02Z stdout F two\n")
        time.sleep(0.3)
        core.patch_namespaced_pod_status("p", ns, {"status": {"containerStatuses": [{
            "name": "main", "image": "python:3.11", "imageID": "", "ready": False,
            "restartCount": 1, "state": {"terminated": {
                "exitCode": 0, "reason": "Completed", "containerID": "kubesim://second"}}}]}})

    threading.Thread(target=finish).start()
    started = time.monotonic()
    text = read_log(core, "p", ns, follow=True, _request_timeout=10)
    assert text == "one\ntwo\n" and time.monotonic() - started < 5


_CRI = ["2025-06-01T10:00:01.5Z stdout F one\n",
        "2025-06-01T10:00:02Z stderr P par\n",
        "2025-06-01T10:00:02.1Z stderr F tial\n",
        "2025-06-01T10:00:03Z stdout F three\n"]


@pytest.mark.parametrize(("query", "text"), [
    ({}, "one\npartial\nthree\n"),
    ({"sinceTime": "2025-06-01T10:00:02Z"}, "partial\nthree\n"),
    ({"tailLines": "2"}, "tial\nthree\n"),
    ({"timestamps": "true", "tailLines": "1"}, "2025-06-01T10:00:03Z three\n"),
    ({"limitBytes": "6"}, "one\npa"),
])
def test_cri_lines_render_under_the_log_options(query: dict[str, str], text: str) -> None:
    assert logs.render(_CRI, query) == text
