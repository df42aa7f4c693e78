"""What a kubelet reports about a pod: its status and the container states behind it.

What belongs here: phase, the kubelet-owned conditions (with lastTransitionTime kept while a
condition's status does not change), containerStatuses, IPs, the pressure-eviction message
(pkg/kubelet/eviction/helpers.go), and the container states and events of image pulls,
start failures and terminations (reason, exit code, signal, termination message), and the
states a restarted kubelet recovers from the stored status.
Conditions other components own (PodScheduled, DisruptionTarget) are kept as stored.

What does not: when the states change (podworker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from typing import TYPE_CHECKING, Any

from kubesim import logs, runtime, sidecars
from kubesim.store import timestamp

if TYPE_CHECKING:
    from kubesim.podworker import PodWorker

_OWNED = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


class ContainerState:
    """What the kubelet knows of one container, in containerStatuses terms."""

    def __init__(self, spec: dict[str, Any], *, init: bool = False) -> None:
        self.spec = spec
        self.init = init
        self.sidecar = init and sidecars.is_sidecar(spec)
        self.started = asyncio.Event()  # set when an instance first runs
        self.name: str = spec["name"]
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.restart_count = 0
        self.container_id: str | None = None
        self.instance: runtime.Container | None = None
        self.done = False
        self.exit_code: int | None = None
        self.recovered: int | None = None  # exit code of an instance lost with its node
        self.ran_seconds = 0.0

    def status(self) -> dict[str, Any]:
        image = self.spec.get("image", "")
        running = "running" in self.state
        # A completed init container counts as ready (kubelet_pods.go); a sidecar only while
        # it runs (no readinessProbe here: running is ready).
        ready = running or (self.init and not self.sidecar and self.exit_code == 0)
        out: dict[str, Any] = {
            "name": self.name, "image": image, "ready": ready, "started": running,
            "restartCount": self.restart_count, "state": self.state,
            "lastState": self.last_state,
            "imageID": f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"
                       if self.container_id else "",
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def recover(worker: PodWorker, pod: dict[str, Any]) -> None:
    """A pod this node ran before its kubelet restarted (node crash and heal): containers
    reported running are gone, as the kubelet reports them after a reboot."""
    status = pod.get("status") or {}
    prior = {cs["name"]: cs for cs in [*(status.get("initContainerStatuses") or []),
                                        *(status.get("containerStatuses") or [])]}
    worker.ip = status.get("podIP", "")
    worker.started_at = status.get("startTime") or timestamp()
    for c in worker.all_containers:
        cs = prior.get(c.name)
        if cs is None:
            continue
        c.restart_count = int(cs.get("restartCount", 0))
        c.last_state = cs.get("lastState") or {}
        c.container_id = cs.get("containerID")
        if "terminated" in (cs.get("state") or {}):
            c.state = cs["state"]  # an instance that ended before: policy decides again
            c.recovered = c.exit_code = cs["state"]["terminated"].get("exitCode")
        if "running" in (cs.get("state") or {}):
            c.state = {"terminated": {
                "exitCode": 137, "reason": "ContainerStatusUnknown",
                "message": "The container could not be located when the pod was terminated",
                "startedAt": cs["state"]["running"].get("startedAt"),
                "finishedAt": timestamp(), "containerID": c.container_id}}
            c.recovered = c.exit_code = 137


def phase(worker: PodWorker) -> str:
    """The pod phase, as pkg/kubelet's getPhase decides it for these states."""
    if worker.failure is not None:
        return "Failed"
    if worker.finished:
        codes = [c.exit_code for c in worker.containers]
        return "Succeeded" if codes and all(code == 0 for code in codes) else "Failed"
    return "Running" if mains_started(worker) else "Pending"


def mains_started(worker: PodWorker) -> bool:
    """Whether a regular container has run (or is running) in this pod."""
    return any("running" in c.state or "terminated" in c.state or c.restart_count
               for c in worker.containers)


def build(worker: PodWorker) -> dict[str, Any]:
    """The status fields the kubelet owns."""
    current = phase(worker)
    # Sidecars count for ContainersReady too, listed first (GenerateContainersReadyCondition).
    unready = [c.name for c in [*(c for c in worker.init_containers if c.sidecar),
                                *worker.containers] if "running" not in c.state]
    terminal = current in ("Succeeded", "Failed")
    ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
    ready = ("True", None, None) if not unready and not terminal else (
        "False", ready_reason,
        None if terminal else f"containers with unready status: [{' '.join(unready)}]")
    sandbox = "False" if terminal else "True"
    # Initialized once the regular init containers completed and every sidecar has started;
    # a sidecar restarting later does not undo it (HasAnyRegularContainerStarted).
    pending_init = [] if mains_started(worker) else [
        c.name for c in worker.init_containers
        if (not c.started.is_set() if c.sidecar else c.exit_code != 0)]
    initialized = ("True", None, None) if not pending_init else (
        "False", "ContainersNotInitialized",
        f"containers with incomplete status: [{' '.join(pending_init)}]")
    host_ip = f"10.0.0.{worker.kubelet.index + 10}"
    status: dict[str, Any] = {
        "phase": current,
        "conditions": {
            "PodReadyToStartContainers": (sandbox, None, None),
            "Initialized": initialized,
            "ContainersReady": ready,
            "Ready": ready,
        },
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": worker.ip, "podIPs": [{"ip": worker.ip}] if worker.ip else [],
        "startTime": worker.started_at,
        "containerStatuses": [c.status() for c in worker.containers],
    }
    if worker.init_containers:
        status["initContainerStatuses"] = [c.status() for c in worker.init_containers]
    if worker.failure is not None:
        status["reason"], status["message"] = worker.failure
    return status


def apply(pod: dict[str, Any], built: dict[str, Any]) -> None:
    """Merge a built status into the stored pod (the `mutate` callback)."""
    status = pod.setdefault("status", {})
    old = {c["type"]: c for c in status.get("conditions") or []}
    now = timestamp()
    for ctype, (value, reason, message) in built["conditions"].items():
        prev = old.get(ctype)
        cond: dict[str, Any] = {"type": ctype, "status": value, "lastProbeTime": None,
                                "lastTransitionTime": prev["lastTransitionTime"]
                                if prev and prev.get("status") == value else now}
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        old[ctype] = cond
    if built.get("reason") == "Evicted":
        prev = old.get("DisruptionTarget")
        old["DisruptionTarget"] = {
            "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
            "message": built["message"], "lastProbeTime": None,
            "lastTransitionTime": prev["lastTransitionTime"] if prev else now}
    order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
             "PodScheduled"]
    status["conditions"] = sorted(
        old.values(), key=lambda c: order.index(c["type"]) if c["type"] in order else -1)
    for key, value in built.items():
        if key != "conditions":
            status[key] = value


def eviction_message(worker: PodWorker, resource: str) -> str:
    """The kubelet's eviction message, naming the container using the most memory."""
    heaviest, usage, request = "", 0, "0"
    for c in worker.containers:
        used = runtime.group_rss_bytes(c.instance.pid) if c.instance is not None else 0
        if used >= usage:
            req = ((c.spec.get("resources") or {}).get("requests") or {}).get(resource, "0")
            heaviest, usage, request = c.name, used, str(req)
    available = "48Mi"
    message = (f"The node was low on resource: {resource}. Threshold quantity: 100Mi, "
               f"available: {available}. ")
    if heaviest:
        message += (f"Container {heaviest} was using {usage // 1024}Ki, request is {request}, "
                    f"has larger consumption of {resource}. ")
    return message


def pulled(worker: PodWorker, c: ContainerState, image: str) -> None:
    if c.spec.get("imagePullPolicy") == "Always":
        worker.kubelet.event(worker.pod, "Pulling", f'Pulling image "{image}"', container=c.name)
        worker.kubelet.event(worker.pod, "Pulled", f'Successfully pulled image "{image}" in 1ms '
                           f"(1ms including waiting). Image size: 0 bytes.", container=c.name)
    else:
        worker.kubelet.event(worker.pod, "Pulled", f'Container image "{image}" already present '
                           "on machine", container=c.name)

def pull_failed(worker: PodWorker, c: ContainerState, image: str) -> None:
    ev = worker.kubelet.event
    waiting = c.state.get("waiting", {}).get("reason")
    if waiting in ("ErrImagePull", "ImagePullBackOff"):
        c.state = {"waiting": {"reason": "ImagePullBackOff",
                               "message": f'Back-off pulling image "{image}"'}}
        ev(worker.pod, "BackOff", f'Back-off pulling image "{image}"', container=c.name)
        ev(worker.pod, "Failed", "Error: ImagePullBackOff", warning=True, container=c.name)
        worker.publish()
        return
    reason = (f'failed to pull and unpack image "{image}": failed to resolve reference '
              f'"{image}": {image}: not found')
    c.state = {"waiting": {"reason": "ErrImagePull", "message": reason}}
    ev(worker.pod, "Pulling", f'Pulling image "{image}"', container=c.name)
    ev(worker.pod, "Failed", f'Failed to pull image "{image}": {reason}', warning=True,
       container=c.name)
    ev(worker.pod, "Failed", "Error: ErrImagePull", warning=True, container=c.name)
    worker.publish()

def invalid_image(worker: PodWorker, c: ContainerState, message: str) -> None:
    """An image name the runtime cannot parse: waiting InvalidImageName, retried."""
    c.state = {"waiting": {"reason": "InvalidImageName", "message": message}}
    worker.kubelet.event(worker.pod, "InspectFailed", message, warning=True, container=c.name)
    worker.kubelet.event(worker.pod, "Failed", "Error: InvalidImageName", warning=True,
                         container=c.name)
    worker.publish()


def start_failed(worker: PodWorker, c: ContainerState, message: str) -> int:
    now = timestamp()
    c.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                              "startedAt": "1970-01-01T00:00:00Z", "finishedAt": now,
                              "containerID": c.container_id}}
    worker.kubelet.event(worker.pod, "Failed", f"Error: {message}", warning=True,
                       container=c.name)
    c.exit_code = 128
    worker.publish()
    return 128

def terminated(worker: PodWorker, c: ContainerState, result: runtime.Exit) -> dict[str, Any]:
    reason = "OOMKilled" if result.oom_killed else (
        "Completed" if result.exit_code == 0 else "Error")
    out: dict[str, Any] = {
        "exitCode": result.exit_code, "reason": reason,
        "startedAt": timestamp(result.started_at.timestamp()),
        "finishedAt": timestamp(result.finished_at.timestamp()),
        "containerID": c.container_id}
    if result.signal is not None:
        out["signal"] = result.signal
    message = termination_message(worker, c, result.exit_code)
    if message:
        out["message"] = message
    return out

def termination_message(worker: PodWorker, c: ContainerState, exit_code: int) -> str:
    container_dir = worker.dir / c.name
    with contextlib.suppress(OSError):
        text = (container_dir / "termination-log").read_bytes()[:4096].decode(errors="replace")
        if text:
            return text
    policy = c.spec.get("terminationMessagePolicy", "File")
    if policy != "FallbackToLogsOnError" or exit_code == 0:
        return ""
    try:
        with (container_dir / f"{c.restart_count}.log").open("rb") as log:
            start = max(0, log.seek(0, os.SEEK_END) - 256 * 1024)  # the end is all the message needs
            log.seek(start)
            found = logs.records(log.read().decode(errors="replace"))[1 if start else 0:]
    except OSError:
        return ""
    # kubelet: the last 80 lines, at most 2 KiB, message part of each CRI record only (partial
    # records joined to their line).
    parsed = [r for r in map(logs.parse_line, found) if r is not None]
    tail = "".join(r[3] + ("" if r[2] else "\n") for r in parsed)
    return "\n".join(tail.rstrip("\n").split("\n")[-80:])[-2048:]
