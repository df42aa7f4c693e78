"""Reading one attempt's pods in wire form: container states, conditions, and what a pod still waits for.

Pure functions over the dicts the API sends (no client, no clock): which state the training container is
in, what keeps it from starting (`blocking_wait`), whether the scheduler has placed the pod, refused it
or not decided at all, and the words trainguard says about a pod that waits (`waiting_for`,
`never_scheduled`). Following the pods over time belongs to `supervise`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainguard.core.backends.kubernetes import manifests

Wire = dict[str, Any]
LINE_LIMIT_CHARS = 8192  # what is shown of a line (or of a piece of a longer one)
SAID_LIMIT_CHARS = 1000  # what is quoted of the cluster's own words (a scheduler's message)

START_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                          "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
TRAINING_CONTAINERS = (manifests.CONTAINER, "pytorch")  # a PyTorchJob's must be named `pytorch`

def container_state(pod: Mapping[str, Any] | None, name: str | None = None) -> Wire:
    """The training container's `state` (running/waiting/terminated), or {}: the one named ``name``, else
    trainguard's (`train` in a Job, `pytorch` in a PyTorchJob's replica)."""
    for status in (pod or {}).get("status", {}).get("containerStatuses") or []:
        if status.get("name") == name or (name is None and status.get("name") in TRAINING_CONTAINERS):
            return dict(status.get("state") or {})
    return {}


def training_name(pod: Mapping[str, Any]) -> str:
    """The name of the pod's training container."""
    names = [str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or ()]
    return next((n for n in names if n in TRAINING_CONTAINERS), manifests.CONTAINER)


def blocking_wait(pod: Mapping[str, Any] | None, own: Mapping[str, Any] | None = None) -> Wire:
    """What keeps the training container waiting: its own `waiting` state (or `own`), or, while it
    waits for the init containers (PodInitializing), the start error of an init container or
    sidecar that cannot start (image pull, config)."""
    mine = dict(own if own is not None else container_state(pod).get("waiting") or {})
    if mine.get("reason") != "PodInitializing":
        return mine
    for status in (pod or {}).get("status", {}).get("initContainerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in START_ERRORS:
            return dict(waiting)
    return mine


def pod_terminal(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def has_condition(obj: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in obj.get("status", {}).get("conditions") or [])


def job_condition(job: Mapping[str, Any], *kinds: str) -> Wire | None:
    """The first True condition of `job` among `kinds`."""
    for condition in job.get("status", {}).get("conditions") or []:
        if condition.get("type") in kinds and condition.get("status") == "True":
            return dict(condition)
    return None


def unschedulable_since(pod: Mapping[str, Any]) -> str | None:
    """The time the pod became unschedulable, while it still is."""
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable" \
                and condition.get("status") == "False":
            return str(condition.get("lastTransitionTime") or "?")
    return None


def printable(raw: bytes) -> str:
    """A log line safe to show: decoded leniently, control characters (ANSI escapes too) dropped, clipped."""
    text = _ANSI.sub("", raw.rstrip(b"\r").decode("utf-8", errors="replace")[:LINE_LIMIT_CHARS])
    return "".join(ch for ch in text if ch == "\t" or (ch >= " " and ch != "\x7f" and not "\x80" <= ch <= "\x9f"))


def pod_scheduled(pod: Mapping[str, Any]) -> Wire:
    """The pod's `PodScheduled` condition, or {}."""
    return next((dict(c) for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == "PodScheduled"), {})


def not_scheduled(pod: Mapping[str, Any]) -> bool:
    """Waiting for a node: not bound, not ended, not being deleted (refused, gated, or not decided on yet)."""
    return not (pod.get("spec") or {}).get("nodeName") and not pod_terminal(pod) \
        and not (pod.get("metadata") or {}).get("deletionTimestamp")


def scheduler_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")


def waiting_for(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """What the pod waits for before its training container runs, and what is missing; None when nothing.

    ("to be scheduled", the scheduler's last word or that none has decided), or ("to start on <node>",
    the container's waiting reason and message, e.g. `ContainerCreating`, `ErrImagePull: ...`).
    """
    if pod_terminal(pod) or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if not_scheduled(pod):
        condition = pod_scheduled(pod)
        if not condition:
            return "to be scheduled", f"no scheduler has decided yet (schedulerName: {scheduler_name(pod)})"
        said = quoted(str(condition.get("message") or condition.get("reason") or "no reason given"))
        if condition.get("reason") == "Unschedulable":
            return "to be scheduled", f"{scheduler_name(pod)} says: {said}"
        return "to be scheduled", f"{condition.get('reason')}: {said}"
    state = container_state(pod)
    if "running" in state or "terminated" in state:
        return None
    node = str(pod["spec"]["nodeName"])
    waiting = blocking_wait(pod)
    if not waiting:
        return f"to start on {node}", "the kubelet has not reported its containers yet"
    message = quoted(str(waiting.get("message") or ""))
    return f"to start on {node}", f"{waiting.get('reason')}: {message}" if message else str(waiting.get("reason"))


def never_scheduled(pod: Mapping[str, Any], waited: str) -> str:
    """The outcome's words for a pod no scheduler decided on within the unschedulable window."""
    return (f"no scheduler decided on pod {pod.get('metadata', {}).get('name')} in {waited} "
            f"(schedulerName: {scheduler_name(pod)}): is a scheduler of that name running?")


def quoted(text: str) -> str:
    """The cluster's own words, safe to show on one line and clipped."""
    shown = printable(text.replace("\n", " ").encode("utf-8", errors="replace"))
    return shown if len(shown) <= SAID_LIMIT_CHARS else f"{shown[:SAID_LIMIT_CHARS]}…"
