"""The Store contract both halves of kubesim build on: resourceVersions, copies, conflicts,
watch fan-out, history, finalizers and event aggregation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubesim.store import AlreadyExists, Conflict, NotFound, Store


def _pod(name: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", **meta}, "spec": {}}


def test_every_change_bumps_the_resource_version_and_reaches_subscribers() -> None:
    async def scenario() -> list[tuple[str, str]]:
        store = Store()
        queue = store.subscribe()
        created = store.create("pods", _pod("p"))
        store.mutate("pods", "default", "p", lambda o: o["metadata"].update(labels={"a": "1"}))
        store.remove("pods", "default", "p")
        seen = [queue.get_nowait() for _ in range(queue.qsize())]
        rvs = [int(o["metadata"]["resourceVersion"]) for _, _, o in seen]
        assert rvs == sorted(rvs) and len(set(rvs)) == 3
        assert int(created["metadata"]["resourceVersion"]) == rvs[0]
        return [(t, r) for t, r, _ in seen]

    assert asyncio.run(scenario()) == [("ADDED", "pods"), ("MODIFIED", "pods"),
                                       ("DELETED", "pods")]


def test_returned_objects_are_copies() -> None:
    store = Store()
    created = store.create("pods", _pod("p"))
    created["metadata"]["labels"] = {"changed": "yes"}
    got = store.get("pods", "default", "p")
    assert got is not None and "labels" not in got["metadata"]


def test_a_no_op_write_keeps_the_resource_version() -> None:
    store = Store()
    created = store.create("pods", _pod("p"))
    same = store.mutate("pods", "default", "p", lambda o: None)
    assert same is not None
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_update_with_a_stale_resource_version_conflicts_unless_told_not_to_check() -> None:
    store = Store()
    created = store.create("pods", _pod("p"))
    store.mutate("pods", "default", "p", lambda o: o["spec"].update(nodeName="n"))
    created["spec"]["hostname"] = "h"
    with pytest.raises(Conflict):
        store.update("pods", created)
    updated = store.update("pods", created, check_rv=False)
    assert updated["spec"] == {"hostname": "h"}


def test_status_update_touches_only_the_status() -> None:
    store = Store()
    created = store.create("pods", _pod("p"))
    created["spec"]["nodeName"] = "ignored"
    created["status"] = {"phase": "Running"}
    updated = store.update("pods", created, subresource="status")
    assert updated["status"] == {"phase": "Running"} and updated["spec"] == {}


def test_create_fills_names_and_refuses_duplicates() -> None:
    store = Store()
    created = store.create("jobs", {"metadata": {"generateName": "train-",
                                                 "namespace": "ns"}, "spec": {}})
    name = created["metadata"]["name"]
    assert name.startswith("train-") and len(name) == len("train-") + 5
    assert created["apiVersion"] == "batch/v1" and created["metadata"]["generation"] == 1
    with pytest.raises(AlreadyExists) as err:
        store.create("jobs", {"metadata": {"name": name, "namespace": "ns"}})
    assert err.value.message == f'jobs.batch "{name}" already exists'


def test_update_of_a_missing_object_is_not_found() -> None:
    with pytest.raises(NotFound) as err:
        Store().update("pods", _pod("ghost"))
    assert err.value.status()["code"] == 404


def test_removing_the_last_finalizer_of_a_deleted_object_removes_it() -> None:
    store = Store()
    store.create("configmaps", {"metadata": {"name": "c", "namespace": "default",
                                             "finalizers": ["x/hold"]}})
    store.mutate("configmaps", "default", "c",
                 lambda o: o["metadata"].update(deletionTimestamp="2025-01-01T00:00:00Z"))
    assert store.get("configmaps", "default", "c") is not None
    store.mutate("configmaps", "default", "c", lambda o: o["metadata"].pop("finalizers"))
    assert store.get("configmaps", "default", "c") is None


def test_a_terminating_pod_stays_until_its_grace_period_is_zero() -> None:
    store = Store()
    store.create("pods", _pod("p"))
    store.mutate("pods", "default", "p", lambda o: o["metadata"].update(
        deletionTimestamp="2025-01-01T00:00:00Z", deletionGracePeriodSeconds=30))
    assert store.get("pods", "default", "p") is not None
    store.mutate("pods", "default", "p",
                 lambda o: o["metadata"].update(deletionGracePeriodSeconds=0))
    assert store.get("pods", "default", "p") is None


def test_history_replays_changes_and_expires_when_compacted() -> None:
    store = Store()
    rv = int(store.resource_version)
    store.create("pods", _pod("a"))
    store.create("pods", _pod("b"))
    history = store.history_since(rv)
    assert history is not None and [h[3]["metadata"]["name"] for h in history] == ["a", "b"]
    store.compact()
    assert store.history_since(rv) is None
    assert store.history_since(int(store.resource_version)) == []


def test_identical_events_aggregate_into_one_with_a_count() -> None:
    store = Store()
    pod = store.create("pods", _pod("p"))
    first = store.record_event(pod, "BackOff", "Back-off restarting", type="Warning",
                               component="kubelet", host="node-1", field_path="spec.containers{c}")
    again = store.record_event(pod, "BackOff", "Back-off restarting", type="Warning",
                               component="kubelet", host="node-1", field_path="spec.containers{c}")
    other = store.record_event(pod, "Started", "Started container c", component="kubelet")
    assert again["metadata"]["name"] == first["metadata"]["name"] and again["count"] == 2
    assert other["count"] == 1
    assert first["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert first["source"] == {"component": "kubelet", "host": "node-1"}
    listed = store.list("events", "default", field_selector="involvedObject.name=p,reason=BackOff")
    assert len(listed) == 1
