"""Pod anti-affinity and node affinity in the scheduler, against the documented behaviour.

Oracles: "Assigning Pods to Nodes" (required and preferred podAntiAffinity with topologyKey
kubernetes.io/hostname; existing pods' anti-affinity binds incoming pods too; nodeAffinity
operators In, NotIn, Exists, DoesNotExist, Gt, Lt and matchFields) and the InterPodAffinity
filter's reasons in the scheduler's FailedScheduling text (1.32). The pure-function tests pin
the words; the cluster test places one pod per node through the real scheduler loop.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from waiting import wait_for

from kubesim import scheduler
from kubesim.config import NodeSpec
from kubesim.nodes import node_object

ONE_PER_NODE = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"job": "t"}}, "topologyKey": "kubernetes.io/hostname"}]}}


def _node(name: str) -> dict[str, Any]:
    return node_object(NodeSpec(name, cpu="4", memory="8Gi"), 1)


def _pod(name: str, node: str | None = None, labels: dict[str, str] | None = None,
         affinity: dict[str, Any] | None = None, ns: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    if affinity:
        spec["affinity"] = affinity
    return {"metadata": {"name": name, "namespace": ns, "uid": name, "labels": labels or {},
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


NODES = {n: _node(n) for n in ("a", "b")}


def test_required_anti_affinity_keeps_a_node_with_a_matching_pod_off_limits() -> None:
    placed = [_pod("t0", "a", {"job": "t"})]
    incoming = _pod("t1", labels={"job": "t"}, affinity=ONE_PER_NODE)
    assert scheduler.failures(incoming, NODES["a"], placed, NODES) == [
        "node(s) didn't match pod anti-affinity rules"]
    assert scheduler.failures(incoming, NODES["b"], placed, NODES) == []


def test_an_existing_pods_anti_affinity_keeps_matching_pods_away_from_its_node() -> None:
    placed = [_pod("t0", "a", {"job": "t"}, ONE_PER_NODE)]
    plain = _pod("other", labels={"job": "t"})
    assert scheduler.failures(plain, NODES["a"], placed, NODES) == [
        "node(s) didn't satisfy existing pods anti-affinity rules"]
    assert scheduler.failures(_pod("x"), NODES["a"], placed, NODES) == []


def test_anti_affinity_terms_select_pods_of_their_own_namespace_unless_told_otherwise() -> None:
    placed = [_pod("t0", "a", {"job": "t"}, ns="elsewhere")]
    incoming = _pod("t1", labels={"job": "t"}, affinity=ONE_PER_NODE)
    assert scheduler.failures(incoming, NODES["a"], placed, NODES) == []
    everywhere = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {**ONE_PER_NODE["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0],
         "namespaceSelector": {}}]}}
    assert scheduler.failures(_pod("t1", affinity=everywhere), NODES["a"], placed, NODES) == [
        "node(s) didn't match pod anti-affinity rules"]


def test_finished_pods_no_longer_repel() -> None:
    done = _pod("t0", "a", {"job": "t"})
    done["status"]["phase"] = "Succeeded"
    incoming = _pod("t1", labels={"job": "t"}, affinity=ONE_PER_NODE)
    assert scheduler.failures(incoming, NODES["a"], [done], NODES) == []


def test_unschedulable_anti_affinity_reads_as_the_schedulers_fit_error() -> None:
    reason = "node(s) didn't match pod anti-affinity rules"
    assert scheduler.fit_error(2, {"a": [reason], "b": [reason]}) == (
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules. preemption: "
        "0/2 nodes are available: 2 No preemption victims found for incoming pod.")


@pytest.mark.parametrize(("expression", "fits"), [
    ({"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["a"]}, False),
    ({"key": "kubernetes.io/hostname", "operator": "In", "values": ["a"]}, True),
    ({"key": "gpu-model", "operator": "DoesNotExist"}, True),
    ({"key": "gpu-model", "operator": "Exists"}, False),
    ({"key": "kubernetes.io/hostname", "operator": "Gt", "values": ["1"]}, False),
])
def test_node_affinity_operators_decide_whether_node_a_fits(expression: dict[str, Any],
                                                             fits: bool) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}}
    expected = [] if fits else ["node(s) didn't match Pod's node affinity/selector"]
    assert scheduler.failures(_pod("p", affinity=affinity), NODES["a"], []) == expected


def test_match_fields_on_metadata_name_avoids_a_node() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["a"]}]}]}}}
    assert scheduler.failures(_pod("p", affinity=affinity), NODES["a"], []) != []
    assert scheduler.failures(_pod("p", affinity=affinity), NODES["b"], []) == []


def _indexed(name: str, completions: int, affinity: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "completionMode": "Indexed", "completions": completions, "parallelism": completions,
        "backoffLimitPerIndex": 0, "template": {
            "metadata": {"labels": {"job": name}},
            "spec": {"restartPolicy": "Never", "affinity": affinity,
                     "terminationGracePeriodSeconds": 1, "containers": [
                         {"name": "main", "image": "python:3.11",
                          "command": ["python", "-c", "import time; time.sleep(60)"]}]}}}}


def _term(name: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"job": name}},
            "topologyKey": "kubernetes.io/hostname"}


def test_required_anti_affinity_places_one_pod_per_node_and_leaves_the_rest_pending(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    batch.create_namespaced_job(ns, _indexed("spread", 3, {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [_term("spread")]}}))

    def settled() -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(ns, label_selector="job=spread").items
        placed = [p for p in pods if p.spec.node_name]
        return pods if len(pods) == 3 and len(placed) == 2 else None

    pods = wait_for(settled, what="two pods placed, one pending")
    assert sorted(p.spec.node_name for p in pods if p.spec.node_name) == ["node-1", "node-2"]
    pending = next(p for p in pods if not p.spec.node_name)
    event = wait_for(lambda: next((e for e in core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={pending.metadata.name}").items
        if e.reason == "FailedScheduling"), None), what="FailedScheduling")
    assert event.message == (
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules. preemption: "
        "0/2 nodes are available: 2 No preemption victims found for incoming pod.")
    batch.delete_namespaced_job("spread", ns, propagation_policy="Background")


def test_preferred_anti_affinity_spreads_pods_but_still_places_them_all(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    batch.create_namespaced_job(ns, _indexed("soft", 3, {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": _term("soft")}]}}))

    def placed() -> list[str] | None:
        nodes = [p.spec.node_name for p in
                 core.list_namespaced_pod(ns, label_selector="job=soft").items]
        return nodes if len(nodes) == 3 and all(nodes) else None

    nodes = wait_for(placed, what="all three pods placed")
    assert sorted(set(nodes)) == ["node-1", "node-2"]
    batch.delete_namespaced_job("soft", ns, propagation_policy="Background")
