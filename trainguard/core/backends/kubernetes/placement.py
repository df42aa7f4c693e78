"""Where a multi-node attempt's pods may go, when the cluster cannot give each its own node.

One pod per node is required pod anti-affinity. The flow's account may not list nodes, so whether
the cluster has N schedulable nodes for the attempt is learnt from the scheduler itself: a pod it
cannot place because of the anti-affinity (`node(s) didn't match pod anti-affinity rules`, the
default scheduler's words) says there are fewer than N. Then the attempt's Job is deleted in the
foreground (its pods, Service and Secret with it; nothing of it has trained: the ranks wait at the
rendezvous for the pod that never started) and created again with the anti-affinity preferred, and
the attempt's report says so. What a pod template says is ``manifests``'s and ``indexed``'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from trainguard.core.backends.kubernetes import kinds
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.errors import NotFound
from trainguard.core.backends.kubernetes.podstate import unschedulable_since
from trainguard.core.backends.kubernetes.watch import RELISTED, ResumingWatch

ANTI_AFFINITY = "didn't match pod anti-affinity rules"
SPREAD = "spread"  # the supervisor's reason to stop: one pod per node cannot be had


def blocked_by_spread(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when the pod is unschedulable because of the pods' anti-affinity."""
    if unschedulable_since(pod) is None:
        return None
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and ANTI_AFFINITY in str(condition.get("message") or ""):
            return str(condition.get("message"))
    return None


def relaxed_note(nodes: int, message: str) -> str:
    """What the attempt's report says of its placement."""
    return (f"one pod per node was relaxed to preferred: the cluster had fewer schedulable nodes than the "
            f"attempt's {nodes} pods (the scheduler: {message.strip()[:300]})")


def delete_and_wait(api: KubeApi, kind: str, namespace: str, job_name: str, selector: str,
                    timeout_seconds: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
    """Delete the Job in the foreground and return once it is gone (its pods and owned objects first).

    Raises:
        TimeoutError: It was still there after ``timeout_seconds``.
    """
    try:
        kinds.delete(api, kind, namespace, job_name, propagation="Foreground")
    except NotFound:
        return
    deadline = clock() + timeout_seconds
    watch = ResumingWatch(api, kinds.resource(kind), namespace, selector, timeout_seconds=max(1, int(timeout_seconds)))
    for event in watch:
        listed = (event["object"].get("items") or []) if event["type"] == RELISTED else None
        names = {str(j["metadata"]["name"]) for j in listed} if listed is not None else set()
        if listed is not None and job_name not in names:
            return
        if event["type"] == "DELETED" and event["object"].get("metadata", {}).get("name") == job_name:
            return
        if clock() > deadline:
            raise TimeoutError(f"the Job {namespace}/{job_name} was not gone {timeout_seconds:g}s after its deletion")
