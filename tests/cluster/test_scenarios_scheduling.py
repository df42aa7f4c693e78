"""The scheduler's decisions and words, checked as pure functions over API-shaped dicts.

The FailedScheduling text is what prefect-kubernetes' diagnostics and the project's
classifier parse, so its exact form (counts, order, the preemption summary) is pinned here.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubesim import scheduler
from kubesim.config import NodeSpec
from kubesim.nodes import node_object

UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}


def _node(name: str, gpus: int = 0, **spec: Any) -> dict[str, Any]:
    node = node_object(NodeSpec(name, gpus=gpus, cpu="4", memory="8Gi"), 1)
    node["spec"].update(spec)
    return node


def _pod(gpus: int = 0, cpu: str = "1", **spec: Any) -> dict[str, Any]:
    limits = {"cpu": cpu, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"metadata": {"name": "p", "uid": "u", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}], **spec},
            "status": {"phase": "Pending"}}


@pytest.mark.parametrize(("pod", "node", "expected"), [
    (_pod(gpus=3), _node("a", gpus=2), ["Insufficient nvidia.com/gpu"]),
    (_pod(cpu="5", gpus=1), _node("a"), ["Insufficient cpu", "Insufficient nvidia.com/gpu"]),
    (_pod(), _node("a", unschedulable=True), ["node(s) were unschedulable"]),
    (_pod(), _node("a", taints=[UNREACHABLE]),
     ["node(s) had untolerated taint {node.kubernetes.io/unreachable: }"]),
    (_pod(nodeSelector={"pool": "gpu"}), _node("a"),
     ["node(s) didn't match Pod's node affinity/selector"]),
    (_pod(nodeSelector={"pool": "gpu"}), _node("a", taints=[UNREACHABLE]),
     ["node(s) had untolerated taint {node.kubernetes.io/unreachable: }"]),
    (_pod(tolerations=[{"operator": "Exists"}]), _node("a", taints=[UNREACHABLE]), []),
    (_pod(gpus=2), _node("a", gpus=2), []),
])
def test_failures_name_the_first_failing_filter_in_the_schedulers_words(
        pod: dict[str, Any], node: dict[str, Any], expected: list[str]) -> None:
    assert scheduler.failures(pod, node, []) == expected


def test_fit_error_sorts_count_first_and_summarises_preemption() -> None:
    reasons = {"a": ["node(s) had untolerated taint {node.kubernetes.io/unreachable: }"],
               "b": ["Insufficient nvidia.com/gpu"], "c": ["Insufficient nvidia.com/gpu"]}
    assert scheduler.fit_error(3, reasons) == (
        "0/3 nodes are available: 1 node(s) had untolerated taint "
        "{node.kubernetes.io/unreachable: }, 2 Insufficient nvidia.com/gpu. preemption: 0/3 "
        "nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption "
        "victims found for incoming pod.")


def test_pods_already_on_a_node_use_up_its_gpus_until_they_finish() -> None:
    node = _node("a", gpus=2)
    running = {**_pod(gpus=2), "spec": {**_pod(gpus=2)["spec"], "nodeName": "a"}}
    assert scheduler.failures(_pod(gpus=1), node, [running]) == ["Insufficient nvidia.com/gpu"]
    running["status"] = {"phase": "Succeeded"}
    assert scheduler.failures(_pod(gpus=1), node, [running]) == []


def test_preemption_picks_the_fewest_lowest_priority_victims_that_make_room() -> None:
    node = _node("a", gpus=2)

    def on_node(name: str, priority: int) -> dict[str, Any]:
        base = _pod(gpus=1)
        return {**base, "metadata": {**base["metadata"], "name": name, "uid": name},
                "spec": {**base["spec"], "nodeName": "a", "priority": priority}}

    pods = [on_node("keep", 500), on_node("low", 0)]
    urgent = {**_pod(gpus=1), "spec": {**_pod(gpus=1)["spec"], "priority": 1000}}
    assert [v["metadata"]["name"] for v in scheduler.find_victims(urgent, node, pods)] == ["low"]
    equal = {**_pod(gpus=1), "spec": {**_pod(gpus=1)["spec"], "priority": 0}}
    assert scheduler.find_victims(equal, node, pods) == []


GPUS = {"a": ["Insufficient nvidia.com/gpu"], "b": ["Insufficient nvidia.com/gpu"]}


@pytest.mark.parametrize(("preemption", "expected"), [
    # the post-filter tried every node (DefaultPreemption.PostFilter prefixes "preemption: ")
    (None, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
           "available: 2 No preemption victims found for incoming pod."),
    # PodEligibleToPreemptOthers said no, in its own words (which end with their own period)
    (scheduler.NEVER, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: not "
                      "eligible due to preemptionPolicy=Never."),
    (scheduler.TERMINATING_VICTIM, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. "
                                   "preemption: not eligible due to a terminating pod on the "
                                   "nominated node."),
    ("", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."),  # victims found: silent
])
def test_fit_error_carries_what_the_preemption_post_filter_said(preemption: str | None,
                                                                expected: str) -> None:
    assert scheduler.fit_error(2, GPUS, preemption) == expected


def test_without_any_node_the_scheduler_says_so_before_any_filter_runs() -> None:
    assert scheduler.fit_error(0, {}) == "no nodes available to schedule pods"


def test_a_pod_that_may_not_preempt_says_why() -> None:
    never = _pod(gpus=1, preemptionPolicy="Never")
    assert scheduler.not_eligible(never, []) == scheduler.NEVER
    waiting = {**_pod(gpus=1), "spec": {**_pod(gpus=1)["spec"], "priority": 1000},
               "status": {"phase": "Pending", "nominatedNodeName": "a"}}
    victim = {**_pod(gpus=1), "spec": {**_pod(gpus=1)["spec"], "nodeName": "a"},
              "status": {"phase": "Running", "conditions": [
                  {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}}
    victim["metadata"] = {**victim["metadata"], "deletionTimestamp": "2025-01-01T00:00:01Z"}
    assert scheduler.not_eligible(waiting, [victim]) == scheduler.TERMINATING_VICTIM
    assert scheduler.not_eligible(waiting, []) is None  # the victim is gone: preempt again if need be
