"""Following one attempt's Job to its end by watch, never by polling, and saying how it ended.

Two resuming watches (the Job, its pods) feed one queue; a third thread follows the training
container's log and hands each line to `on_line`. The supervisor wakes on every change, so a
terminal pod is noticed as soon as the API server reports it. Given the Job it just created, both
watches start from that Job's resourceVersion (its pods are all created later), so an attempt costs
three long-lived requests (two watches and the log) and nothing more while it runs: no lists unless
a watch is too old (410), watches resumed where they stopped. It ends the attempt when:

- the Job is Complete or Failed, or it is failing (`FailureTarget`) and its pod has ended;
- the pod failed with `DisruptionTarget` (the podFailurePolicy ignores it, the flow retries it);
- the pod stays unschedulable longer than `unschedulable_seconds` (the scheduler's events are kept);
- the container cannot start (image pull, config) for `start_error_seconds`, or an init container
  or sidecar it waits for cannot;
- nothing new was logged for `stall_seconds`, or the attempt outlived its deadline plus a margin;
- the Job was deleted by someone else.

It never deletes anything: on SIGTERM or cancellation it stops watching and re-raises, and the
flow's `finally` keeps the evidence before `release` lets the cluster clean up.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.core import masking
from trainguard.core.backends.kubernetes import manifests
from trainguard.core.backends.kubernetes.errors import KubeError, Transient
from trainguard.core.backends.kubernetes.watch import RELISTED, ResumingWatch, WatchApi

Wire = dict[str, Any]
LineSink = Callable[[str], None]
START_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                          "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
TRAINING_CONTAINERS = (manifests.CONTAINER, "pytorch")  # a PyTorchJob's must be named `pytorch`
LOG_TAIL_LINES = 200
LINE_LIMIT_CHARS = 8192  # what is shown of a line (or of a piece of a longer one)
LINE_PIECE_BYTES = 64 * 1024  # a longer line is handed out in pieces, as the local runner and the Slurm tail do


@dataclass(frozen=True)
class Limits:
    """How long the supervisor waits for each kind of non-progress."""

    unschedulable_seconds: float = 600.0
    start_error_seconds: float = 60.0
    stall_seconds: float | None = None
    deadline_seconds: float | None = None
    deadline_margin_seconds: float = 120.0
    settle_seconds: float = 3.0  # after the pod ends, how long to wait for the Job's own verdict
    watch_timeout_seconds: int = 300  # the server ends a watch then; it is resumed, not re-listed
    log_read_timeout_seconds: float = 300.0  # a silent log stream is reopened after this long


@dataclass
class Ending:
    """Where the supervisor stopped: the last Job and pod seen, and why it stopped."""

    job: Wire | None
    pod: Wire | None
    why: str = ""
    message: str = ""
    job_deleted: bool = False
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))
    pods: dict[str, Wire] = field(default_factory=dict)  # every pod seen, by name (several on several nodes)


class Supervisor:
    """Watches one attempt (its Job and pods, by the attempt's labels) until it is terminal."""

    def __init__(self, api: Any, namespace: str, run_id: str, attempt: int, limits: Limits, *,
                 on_line: LineSink | None = None, clock: Callable[[], float] = time.monotonic,
                 created: Wire | None = None, masker: masking.Masker | None = None,
                 job_resource: str = "jobs", done: tuple[str, ...] = ("Complete", "Failed")) -> None:
        self.api, self.namespace, self.limits, self.clock = api, namespace, limits, clock
        self.masker = masker or masking.current()  # the attempt's secrets are registered by now
        self.job_name = manifests.job_name(run_id, attempt)
        self.selector = manifests.selector(run_id, attempt)
        self.on_line = on_line
        # the attempt's object (a Job, or a PyTorchJob) and the conditions that say it has ended
        self.job_resource, self.done = job_resource, done
        self.events: queue.Queue[tuple[str, Wire]] = queue.Queue()
        self.stop = threading.Event()
        self.ending = Ending(job=None, pod=None)
        self.last_output = clock()
        self.followed: set[str] = set()
        self.followers: list[threading.Thread] = []
        self.marks: dict[str, float] = {}  # when each waiting condition was first seen
        self.listed: set[str] = set()  # the resources listed at least once (a verdict needs both)
        self.since: str | None = None  # where both watches start when the caller holds the Job's state
        version = ((created or {}).get("metadata") or {}).get("resourceVersion")
        if created is not None and version:
            self.ending.job, self.since = created, str(version)
            self.listed = {job_resource, "pods"}

    def run(self) -> Ending:
        """Block until the attempt is terminal (or a limit ran out); the watches stop either way."""
        started = self.clock()
        threads = [self._thread(self._pump, self.job_resource), self._thread(self._pump, "pods")]
        try:
            while True:
                try:
                    source, event = self.events.get(timeout=0.5)
                    self._apply(source, event)
                except queue.Empty:
                    pass
                why = self._verdict(started)
                if why:
                    self.ending.why = why
                    self._settle(why)
                    self._drain_logs(self.clock() + self.limits.settle_seconds)
                    return self.ending
        finally:
            self.stop.set()
            del threads  # daemon threads end with their stream; nothing may block the caller

    def _settle(self, why: str) -> None:
        if why == "job" and not container_state(self.ending.pod).get("terminated"):
            self._read_pods()

    def _read_pods(self) -> None:
        """Read the pods once: the Job ends only after its pod did, but the pod watch may lag behind.

        Without this the outcome would keep the Job's bare verdict (BackoffLimitExceeded) instead of
        the container's own end (OOMKilled, its exit code).
        """
        try:
            pods = self.api.list_pods(self.namespace, self.selector).get("items") or []
        except KubeError:
            return  # what the watches saw stands; the evidence reads the pods again
        for pod in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("creationTimestamp") or "")):
            self._apply_pod(pod)

    def _drain_logs(self, until: float) -> None:
        """Let the log followers of ended pods hand out their last lines (bounded)."""
        for thread in self.followers:
            thread.join(max(0.0, until - self.clock()))

    # -- feeding the queue ----------------------------------------------------------------

    def _thread(self, target: Callable[..., None], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"trainguard-{target.__name__}")
        thread.start()
        return thread

    def _pump(self, resource: str) -> None:
        api: WatchApi = self.api
        watch = ResumingWatch(api, resource, self.namespace, self.selector, resource_version=self.since,
                              timeout_seconds=self.limits.watch_timeout_seconds)
        try:
            for event in watch:
                if self.stop.is_set():
                    return
                self.events.put((resource, event))
        except KubeError as exc:  # the API is gone for longer than KubeApi retries: say so, end
            self.events.put((resource, {"type": "FAILED", "object": {"message": str(exc)}}))

    def _follow_log(self, pod_name: str, prefix: str = "", container: str = manifests.CONTAINER) -> None:
        seen = 0
        for _ in range(20):  # a dropped stream is resumed; lines already handed out are skipped
            count, cutter = 0, LineCutter()
            try:
                for chunk in self.api.stream_pod_log(self.namespace, pod_name, container,
                                                     read_timeout_seconds=self.limits.log_read_timeout_seconds):
                    for raw in cutter.feed(chunk):
                        count += 1
                        if count > seen:
                            seen = count
                            self._line(raw, prefix)
                    if self.stop.is_set():
                        return
                if cutter.pending and count + 1 > seen:
                    self._line(cutter.pending, prefix)
                return
            except Transient:
                time.sleep(0.2)
            except KubeError:
                return

    def _line(self, raw: bytes, prefix: str = "") -> None:
        text = prefix + self.masker.mask(printable(raw))
        self.last_output = self.clock()
        self.ending.log_tail.append(text)
        if self.on_line is not None:
            try:
                self.on_line(text)
            except Exception:  # a broken sink must not end the supervision
                self.on_line = None

    # -- reading the events ---------------------------------------------------------------

    def _apply(self, source: str, event: Wire) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "FAILED":
            self.ending.message = str(obj.get("message", ""))
            self.ending.why = "api"
            return
        objects = (obj.get("items") or []) if kind == RELISTED else [obj]
        if kind == RELISTED:
            self.listed.add(source)
        if source == self.job_resource:
            self._apply_job(kind, objects)
        else:
            for pod in objects:
                if kind != "DELETED" or self.ending.pod is None:
                    self._apply_pod(pod)

    def _apply_job(self, kind: Any, jobs: list[Wire]) -> None:
        mine = [j for j in jobs if j.get("metadata", {}).get("name") == self.job_name]
        if kind == "DELETED" and mine or (kind == RELISTED and not mine and self.ending.job is not None):
            self.ending.job_deleted = True
        if mine:
            self.ending.job = mine[-1]

    def _apply_pod(self, pod: Wire) -> None:
        current = self.ending.pod
        if current is not None and pod["metadata"]["name"] != current["metadata"]["name"]:
            if pod_terminal(current) and not pod_terminal(pod):
                return  # the Job's replacement for an ignored disruption: the attempt ended with the first
        self.ending.pod = pod
        self._follow(pod)

    def _follow(self, pod: Wire, prefix: str = "") -> None:
        """Start following the pod's training log once its container runs (or already ended)."""
        state, name = container_state(pod), pod["metadata"]["name"]
        if ("running" in state or "terminated" in state) and name not in self.followed:
            self.followed.add(name)
            self.last_output = self.clock()
            self.followers.append(self._thread(self._follow_log, name, prefix, training_name(pod)))

    def _verdict(self, started: float) -> str:
        """Why the attempt is over now, or "" while it is not."""
        ending, limits, now = self.ending, self.limits, self.clock()
        if ending.why:
            return ending.why
        if len(self.listed) < 2:
            return ""
        job, pod = ending.job, ending.pod
        if job is not None and job_condition(job, *self.done):
            return "job"
        if pod is not None and pod_terminal(pod):
            if has_condition(pod, "DisruptionTarget") or job_condition(job or {}, "FailureTarget"):
                return "pod"
            if self._lasted("pod-ended", True, now) >= limits.settle_seconds:
                return "pod"
        if ending.job_deleted:
            return "deleted"
        return self._waited_too_long(pod, started, now)

    def _waited_too_long(self, pod: Wire | None, started: float, now: float) -> str:
        limits = self.limits
        stuck = pod is not None and unschedulable_since(pod) is not None
        if self._lasted("unschedulable", stuck, now) >= limits.unschedulable_seconds:
            return "unschedulable"
        waiting = blocking_wait(pod).get("reason") if pod else None
        if self._lasted("start-error", waiting in START_ERRORS, now) >= limits.start_error_seconds:
            return "start_error"
        if limits.stall_seconds and self.followed and now - self.last_output >= limits.stall_seconds:
            return "stalled"
        if limits.deadline_seconds and now - started >= limits.deadline_seconds + limits.deadline_margin_seconds:
            return "deadline"
        return ""

    def _lasted(self, mark: str, holds: bool, now: float) -> float:
        """How long `holds` has been true without a break (-1 while it is not)."""
        if not holds:
            self.marks.pop(mark, None)
            return -1.0
        return now - self.marks.setdefault(mark, now)


class LineCutter:
    """Splits a byte stream into lines, and a line longer than `LINE_PIECE_BYTES` into pieces.

    The pieces are cut at fixed offsets from the line's start, so a stream read again after a drop
    is cut the same way; what is held back is never more than one piece plus one chunk, so a
    128 MB progress bar that never prints a newline costs linear time and is shown as it grows.
    """

    def __init__(self, piece_bytes: int = 0) -> None:
        self.piece_bytes = piece_bytes or LINE_PIECE_BYTES
        self.pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines and pieces `chunk` completes; a line's last piece waits for its newline."""
        *lines, rest = (self.pending + chunk).split(b"\n")
        size, found = self.piece_bytes, []
        for line in lines:
            found.extend([line[i:i + size] for i in range(0, len(line), size)] or [b""])
        cut = 0
        while len(rest) - cut > size:
            found.append(rest[cut:cut + size])
            cut += size
        self.pending = rest[cut:]
        return found


# -- reading wire-form objects ------------------------------------------------------------

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


