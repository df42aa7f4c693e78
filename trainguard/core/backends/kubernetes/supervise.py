"""Following one attempt's Job to its end by watch, never by polling, and saying how it ended.

Two resuming watches (the Job, its pods) feed one queue; a third thread follows the training
container's log and hands each line to `on_line`. The supervisor wakes on every change, so a
terminal pod is noticed as soon as the API server reports it. Given the Job it just created, both
watches start from that Job's resourceVersion (its pods are all created later), so an attempt costs
three long-lived requests (two watches and the log) and nothing more while it runs: no lists unless
a watch is too old (410), watches resumed where they stopped. It ends the attempt when:

- the Job is Complete or Failed, or it is failing (`FailureTarget`) and its pod has ended;
- the pod failed with `DisruptionTarget` (the podFailurePolicy ignores it, the flow retries it);
- the pod stays unscheduled longer than `unschedulable_seconds`: refused by the scheduler (its events are
  kept), or never decided on at all (no scheduler serves its `schedulerName`, or that scheduler is down);
- the container cannot start (image pull, config) for `start_error_seconds`, or an init container
  or sidecar it waits for cannot;
- nothing new was logged for `stall_seconds`, or the attempt outlived its deadline plus a margin;
- the Job was deleted by someone else.

While a pod is not running yet it says, at growing intervals (`waits.WaitNotice`), what the pod waits
for and what is missing: the scheduler's last word or that none has decided, the container's waiting
reason (`podstate.waiting_for`).

It never deletes anything: on SIGTERM or cancellation it stops watching and re-raises, and the
flow's `finally` keeps the evidence before `release` lets the cluster clean up.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainguard.core import masking
from trainguard.core.backends.kubernetes import manifests
from trainguard.core.backends.kubernetes.errors import KubeError, Transient
from trainguard.core.backends.kubernetes.podstate import (
    START_ERRORS, Wire, blocking_wait, container_state, has_condition, job_condition, never_scheduled, not_scheduled,
    pod_scheduled, pod_terminal, printable, training_name, waiting_for,
)
from trainguard.core.backends.kubernetes.watch import RELISTED, ResumingWatch, WatchApi
from trainguard.core.backends.waits import FIRST_SECONDS, WaitNotice, span
LineSink = Callable[[str], None]
LOG_TAIL_LINES = 200
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
    report_first_seconds: float = FIRST_SECONDS  # a pod not running yet is reported after this long, then less often


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
        self.notice = WaitNotice(limits.report_first_seconds, clock=clock)  # when to say what a pod waits for
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
                self._report_waits()
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
        # refused by the scheduler, or never decided on (no scheduler of its name, or that scheduler is down)
        stuck = pod is not None and not_scheduled(pod)
        if self._lasted("unschedulable", stuck, now) >= limits.unschedulable_seconds:
            if pod is not None and not pod_scheduled(pod).get("message"):
                self.ending.message = never_scheduled(pod, span(limits.unschedulable_seconds))
            return "unschedulable"
        waiting = blocking_wait(pod).get("reason") if pod else None
        if self._lasted("start-error", waiting in START_ERRORS, now) >= limits.start_error_seconds:
            return "start_error"
        if limits.stall_seconds and self.followed and now - self.last_output >= limits.stall_seconds:
            return "stalled"
        if limits.deadline_seconds and now - started >= limits.deadline_seconds + limits.deadline_margin_seconds:
            return "deadline"
        return ""

    # -- saying what the attempt waits for ------------------------------------------------

    def _waiting_pods(self) -> list[Wire]:
        """The pods whose training container may still have to start."""
        return [self.ending.pod] if self.ending.pod is not None else []

    def _report_waits(self) -> None:
        """While a pod is not running yet, say at growing intervals what it waits for and what is missing."""
        pods = self._waiting_pods()
        waits: dict[tuple[str, str], list[str]] = {}
        for pod in pods:
            found = waiting_for(pod)
            if found is not None:
                waits.setdefault(found, []).append(str(pod["metadata"]["name"]))
        no_pod = not pods and self.ending.job is not None and len(self.listed) == 2
        elapsed = self.notice.due(bool(waits) or no_pod)
        if elapsed is None:
            return
        if no_pod:
            kind = "PyTorchJob" if self.job_resource == "pytorchjobs" else "Job"
            self._say(f"waiting {span(elapsed)} for the {kind} {self.namespace}/{self.job_name} to create its pods "
                      f"(`kubectl describe {kind.lower()} -n {self.namespace} {self.job_name}` says what holds them)")
        for (what, missing), names in waits.items():
            self._say(f"waiting {span(elapsed)}{self._bound(what, missing)} for {_pods(names)} {what}: {missing}")

    def _bound(self, what: str, missing: str) -> str:
        """How long this wait may last before it ends the attempt, where it does."""
        if what == "to be scheduled":
            return f" (of {span(self.limits.unschedulable_seconds)})"
        if missing.split(":", 1)[0] in START_ERRORS:
            return f" (of {span(self.limits.start_error_seconds)})"
        return ""

    def _say(self, message: str) -> None:
        """trainguard's own line, beside the training output (never into the log tail)."""
        line = f"trainguard: {message}"
        if self.on_line is None:
            print(line, flush=True)
            return
        try:
            self.on_line(line)
        except Exception:  # a broken sink must not end the supervision
            self.on_line = None

    def _lasted(self, mark: str, holds: bool, now: float) -> float:
        """How long `holds` has been true without a break (-1 while it is not)."""
        if not holds:
            self.marks.pop(mark, None)
            return -1.0
        return now - self.marks.setdefault(mark, now)


def _pods(names: list[str]) -> str:
    """ "pod a", "pods a, b", "pods a, b, c and 5 more"."""
    if len(names) == 1:
        return f"pod {names[0]}"
    shown = ", ".join(sorted(names)[:3])
    return f"pods {shown}" + (f" and {len(names) - 3} more" if len(names) > 3 else "")


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
