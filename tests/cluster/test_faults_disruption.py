"""Disruptions through the control API and the Eviction API, as the official client sees them:
OOM kill, node-pressure eviction, API eviction, preemption, node partition."""

from __future__ import annotations

from typing import Any

import pytest
from cluster_helpers import seeded_pod
from kubernetes import client, watch

import kubesim.fixture
from waiting import wait_for

_SLEEPER = "import time; print('up', flush=True); time.sleep(60)"


def _running_pod(core: client.CoreV1Api, ns: str, name: str, node: str = "node-1",
                 grace: int = 1) -> Any:
    core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "main", "image": "python:3.11",
                        "command": ["python", "-c", _SLEEPER]}]}})
    return _until(core, ns, name, lambda p: p.status.phase == "Running")


def _until(core: client.CoreV1Api, ns: str, name: str, check: Any, timeout: int = 15,
           trigger: Any = None) -> Any:
    """The first state of the pod that passes check, seen through a watch so no brief state
    between two polls is missed; trigger runs once the watch has delivered the pod."""
    seen = None
    for event in watch.Watch().stream(core.list_namespaced_pod, ns, timeout_seconds=timeout,
                                      field_selector=f"metadata.name={name}"):
        seen = event["object"]
        if check(seen):
            return seen
        if trigger is not None:
            trigger()
            trigger = None
    raise AssertionError(f"pod {name} never reached the state; last seen: "
                         f"{seen.status.phase if seen else None} "
                         f"{seen.status.container_statuses if seen else None}")


def _terminated(pod: Any) -> Any:
    statuses = pod.status.container_statuses or []
    return statuses and statuses[0].state.terminated


def _condition(pod: Any, kind: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def test_oom_kill_ends_the_container_oomkilled_137(sim: kubesim.fixture.Sim,
                                                   core: client.CoreV1Api, ns: str) -> None:
    _running_pod(core, ns, "p")
    pod = _until(core, ns, "p", lambda p: p.status.phase == "Failed",
                 trigger=lambda: sim.oom_kill(ns, "p"))
    state = pod.status.container_statuses[0].state.terminated
    assert (state.exit_code, state.reason) == (137, "OOMKilled")
    assert pod.status.phase == "Failed"


def test_pressure_eviction_fails_the_pod_with_disruption_target(sim: kubesim.fixture.Sim,
                                                                core: client.CoreV1Api,
                                                                ns: str) -> None:
    _running_pod(core, ns, "p")
    pod = _until(core, ns, "p", lambda p: p.status.phase == "Failed",
                 trigger=lambda: sim.evict(ns, "p", resource="memory"))
    assert pod.status.reason == "Evicted"
    assert pod.status.message.startswith("The node was low on resource: memory.")
    target = _condition(pod, "DisruptionTarget")
    assert (target.status, target.reason) == ("True", "TerminationByKubelet")
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=p,reason=Evicted")
    assert events.items


def test_eviction_api_sends_sigterm_and_marks_the_disruption(core: client.CoreV1Api,
                                                            ns: str) -> None:
    _running_pod(core, ns, "p", grace=5)
    pod = _until(core, ns, "p", _terminated, trigger=lambda: core.create_namespaced_pod_eviction(
        "p", ns, {"apiVersion": "policy/v1", "kind": "Eviction",
                  "metadata": {"name": "p", "namespace": ns}}))
    assert pod.metadata.deletion_timestamp is not None
    target = _condition(pod, "DisruptionTarget")
    assert (target.reason, target.message) == ("EvictionByEvictionAPI", "Eviction API: evicting")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 143
    wait_for(lambda: not core.list_namespaced_pod(ns, field_selector="metadata.name=p").items, 10,
             "the evicted pod to be removed")


def test_eviction_of_a_missing_pod_is_404(core: client.CoreV1Api, ns: str) -> None:
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_pod_eviction("ghost", ns, {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "ghost", "namespace": ns}})
    assert err.value.status == 404


def test_preemption_marks_the_victim_and_records_preempted(sim: kubesim.fixture.Sim,
                                                           core: client.CoreV1Api,
                                                           ns: str) -> None:
    _running_pod(core, ns, "p")
    pod = _until(core, ns, "p", lambda p: _condition(p, "DisruptionTarget") is not None,
                 trigger=lambda: sim.preempt(ns, "p"))
    assert _condition(pod, "DisruptionTarget").reason == "PreemptionByScheduler"
    wait_for(lambda: core.list_namespaced_event(ns, field_selector="reason=Preempted").items, 10,
             "a Preempted event")


@pytest.mark.parametrize(("grace_seconds", "expected"), [(7, 7), (None, 30)])
def test_preemption_gives_the_victim_the_grace_period_asked_for(
        sim: kubesim.fixture.Sim, core: client.CoreV1Api, ns: str,
        grace_seconds: int | None, expected: int) -> None:
    # A seeded pod: no kubelet finishes its deletion, so the grace period stays readable.
    core.create_namespaced_pod(ns, seeded_pod("p"))
    sim.preempt(ns, "p", grace_seconds=grace_seconds)
    pod = core.read_namespaced_pod("p", ns)
    assert pod.metadata.deletion_timestamp is not None
    assert pod.metadata.deletion_grace_period_seconds == expected


@pytest.mark.parametrize("grace_seconds", [-1, "soon", 2.5, True])
def test_preemption_with_a_bad_grace_period_is_refused_in_one_line(
        sim: kubesim.fixture.Sim, core: client.CoreV1Api, ns: str, grace_seconds: Any) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    with pytest.raises(kubesim.fixture.ControlError) as err:
        sim.preempt(ns, "p", grace_seconds=grace_seconds)
    assert "400 control API: preempt grace_seconds must be a whole number" in str(err.value)
    assert core.read_namespaced_pod("p", ns).metadata.deletion_timestamp is None


def test_partitioned_node_goes_unknown_and_heals(sim: kubesim.fixture.Sim,
                                                 core: client.CoreV1Api) -> None:
    def ready(node: Any) -> Any:
        return next(c for c in node.status.conditions if c.type == "Ready")

    sim.node("node-2").partition()
    try:
        wait_for(lambda: ready(core.read_node("node-2")).status == "Unknown", 15, "node-2 to go Unknown")
        node = core.read_node("node-2")
        assert ready(node).reason == "NodeStatusUnknown"
        assert ready(node).message == "Kubelet stopped posting node status."
        assert "node.kubernetes.io/unreachable" in {t.key for t in node.spec.taints or []}
    finally:
        sim.node("node-2").heal()
    wait_for(lambda: ready(core.read_node("node-2")).status == "True", 15, "node-2 to come back")


def test_disruption_of_an_unknown_pod_is_refused_in_one_line(sim: kubesim.fixture.Sim,
                                                             ns: str) -> None:
    with pytest.raises(kubesim.fixture.ControlError) as err:
        sim.oom_kill(ns, "ghost")
    assert '404 pods "ghost" not found' in str(err.value)
