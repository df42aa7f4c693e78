"""The evidence path with clients nobody here wrote: create a job, watch its pods by label, read
the previous log, list events by field selector, delete with Foreground propagation.

Once with the official `kubernetes` client, once with `kubernetes_asyncio`; every object read
is also deserialized with the official models so a shape bug fails here.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from cluster_helpers import read_log, shape
from kubernetes import client, watch
from kubernetes_asyncio import client as aclient
from kubernetes_asyncio import config as aconfig
from kubernetes_asyncio import watch as awatch
from waiting import wait_for

_FLAKY = ("import os, sys, time\n"
          "marker = sys.argv[1]\n"
          "first = not os.path.exists(marker)\n"
          "open(marker, 'a').close()\n"
          "print('crash on first attempt' if first else 'resumed', flush=True)\n"
          "sys.exit(1) if first else time.sleep(60)\n")


def _job(marker: Path) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
            "spec": {"backoffLimit": 5, "template": {"spec": {
                "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "train", "image": "ghcr.io/acme/train:1",
                                "command": ["python", "-c", _FLAKY, str(marker)]}]}}}}


def _restarted(pod: Any) -> bool:
    statuses = pod.status.container_statuses or []
    return bool(statuses) and statuses[0].restart_count >= 1 and \
        statuses[0].last_state.terminated is not None


def test_official_client_follows_a_restarting_job(api_client: client.ApiClient,
                                                  batch: client.BatchV1Api,
                                                  core: client.CoreV1Api, ns: str,
                                                  tmp_path: Path) -> None:
    batch.create_namespaced_job(ns, _job(tmp_path / "marker"))
    seen, pod = [], None
    for event in watch.Watch().stream(core.list_namespaced_pod, ns,
                                      label_selector="job-name=train", timeout_seconds=20):
        seen.append(event["type"])
        shape(event["raw_object"], "V1Pod")
        if _restarted(event["object"]):
            pod = event["object"]
            break
    assert pod is not None and seen[0] == "ADDED"
    terminated = pod.status.container_statuses[0].last_state.terminated
    assert (terminated.exit_code, terminated.reason) == (1, "Error")
    name = pod.metadata.name
    assert read_log(core, name, ns, previous=True) == "crash on first attempt\n"
    events = core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},involvedObject.kind=Pod")
    reasons = {e.reason for e in events.items}
    assert {"Scheduled", "Created", "Started", "BackOff"} <= reasons
    assert all(e.involved_object.uid == pod.metadata.uid for e in events.items)
    batch.delete_namespaced_job("train", ns, propagation_policy="Foreground")
    _assert_all_gone(batch, core, ns)


def _assert_all_gone(batch: client.BatchV1Api, core: client.CoreV1Api, ns: str) -> None:
    try:
        wait_for(lambda: not (batch.list_namespaced_job(ns).items or core.list_namespaced_pod(ns).items), 10,
                 "the job and its pods to go after a Foreground delete")
    except AssertionError as exc:
        left = [(p.metadata.name, p.status.phase, p.metadata.finalizers) for p in core.list_namespaced_pod(ns).items]
        raise AssertionError(f"{exc}; pods left (name, phase, finalizers): {left}") from None


async def _async_flow(kubeconfig: str, ns: str, marker: Path) -> dict[str, Any]:
    api = await aconfig.new_client_from_config(config_file=kubeconfig)
    async with api:
        batch, core = aclient.BatchV1Api(api), aclient.CoreV1Api(api)
        await batch.create_namespaced_job(ns, _job(marker))
        pod = None
        stream = awatch.Watch().stream(core.list_namespaced_pod, ns,
                                       label_selector="job-name=train", timeout_seconds=20)
        async with stream as events:
            async for event in events:
                if _restarted(event["object"]):
                    pod = event["object"]
                    break
        assert pod is not None
        name = pod.metadata.name
        previous = await core.read_namespaced_pod_log(name, ns, previous=True)
        events = await core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        await batch.delete_namespaced_job("train", ns, propagation_policy="Foreground")
        return {"previous": previous, "reasons": {e.reason for e in events.items}}


async def _jobs_left(kubeconfig: str, ns: str) -> list[Any]:
    api = await aconfig.new_client_from_config(config_file=kubeconfig)
    async with api:
        return list((await aclient.BatchV1Api(api).list_namespaced_job(ns)).items)


def test_kubernetes_asyncio_follows_a_restarting_job(sim: Any, ns: str, tmp_path: Path) -> None:
    result = asyncio.run(_async_flow(str(sim.kubeconfig), ns, tmp_path / "marker"))
    assert result["previous"] == "crash on first attempt\n"
    assert {"Scheduled", "Started", "BackOff"} <= result["reasons"]
    wait_for(lambda: not asyncio.run(_jobs_left(str(sim.kubeconfig), ns)), 10, "the deleted job to go")


def test_every_kind_deserializes_with_the_official_models(api_client: client.ApiClient,
                                                          batch: client.BatchV1Api,
                                                          core: client.CoreV1Api, ns: str,
                                                          tmp_path: Path) -> None:
    batch.create_namespaced_job(ns, _job(tmp_path / "marker"))
    wait_for(lambda: any(_restarted(p) for p in core.list_namespaced_pod(ns).items), 20, "the job's pod to restart")
    for path, klass in [(f"/api/v1/namespaces/{ns}/pods", "V1PodList"),
                        (f"/apis/batch/v1/namespaces/{ns}/jobs", "V1JobList"),
                        (f"/api/v1/namespaces/{ns}/events", "CoreV1EventList"),
                        ("/api/v1/nodes", "V1NodeList"),
                        ("/api/v1/namespaces", "V1NamespaceList"),
                        (f"/api/v1/namespaces/{ns}/serviceaccounts", "V1ServiceAccountList")]:
        raw = api_client.call_api(path, "GET", auth_settings=["BearerToken"],
                                  _preload_content=False)
        assert shape(json.loads(raw.data), klass).items, f"{path} listed nothing"
    batch.delete_namespaced_job("train", ns, propagation_policy="Background")
