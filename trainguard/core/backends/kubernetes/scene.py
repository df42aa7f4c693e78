"""The crime scene of one Kubernetes attempt as collection gathers it, and what triage reads from it.

`Scene` holds what the API answered (the Job, its pods, events, nodes, the spooled logs);
`ClusterWriter` puts items into the store and keeps the manifest's two lists; `ClusterFacts` is the
small value triage needs (reason, exit code, conditions, events, the log as a local file), built
by `facts_of` and read back from its JSON (`ClusterFacts.from_dict`, with `as_text` and its kin)
by ``kept``. Also here: `scrub` (secret-looking variables and flags of a stored object as
``***``; the writer's masker then masks every value the flow knows to be secret). Which items
are collected, and in what order, is ``evidence``'s business; reading the API is ``api``'s.
"""

from __future__ import annotations

import codecs
import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from trainguard_entrypoint.redact import REDACTED, is_secret_name, redact_argv, redact_text

from trainguard.core import masking
from trainguard.core.backends import workspace_evidence
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.collector import training_container
from trainguard.core.backends.kubernetes.describe import event_time
from trainguard.core.backends.kubernetes.errors import Transient
from trainguard.core.backends.kubernetes.podstate import blocking_wait
from trainguard.core.stores.base import EvidenceStore

T = TypeVar("T")
KUBERNETES = "kubernetes"
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_MASK_PIECE_BYTES = 1024 * 1024


class BreakerApi(KubeApi):
    """The same cluster, but once calls failed transiently `limit` times in a row, no more are tried.

    Collection runs in a ``finally``: with the API down, each call would spend its whole retry
    budget and the flow would wait minutes for a row of identical errors. After the limit each
    call fails at once, saying so, for the rest of this collection; a success before the limit
    starts the count again.
    """

    def __init__(self, inner: KubeApi, limit: int = 3) -> None:
        super().__init__(inner.api_client, retry=inner.retry, sleep=inner.sleep, clock=inner.clock)
        self.limit, self.failures, self.last = limit, 0, ""

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.failures >= self.limit:
            raise Transient(f"{what}: not tried: the API failed {self.failures} times in a row (last: {self.last})")
        try:
            result = super().call(what, fn, *args, **kwargs)
        except Transient as exc:
            self.failures, self.last = self.failures + 1, str(exc)
            raise
        self.failures = 0
        return result


class ClusterWriter(workspace_evidence.BundleWriter):
    """The shared evidence collector, talking to the cluster through an API that stops after repeated failures.

    Everything it stores that came from the job or the cluster goes through one masker: JSON
    (`put_json`), text (`put_text`), spooled files (`mask_file`) and the reasons of missing items,
    which quote what the API or the collector pod said. Core dumps alone are stored byte for byte.
    """

    def __init__(self, api: KubeApi, store: EvidenceStore, prefix: str, now: Callable[[], datetime],
                 masker: masking.Masker | None = None) -> None:
        super().__init__(store, prefix, now)
        self.api: KubeApi = BreakerApi(api)
        self.masker = masker or masking.current()

    def absent(self, name: str, source: str, reason: str, original: str = "", applicable: bool = True) -> None:
        super().absent(name, source, self.masker.for_people(reason), original, applicable)

    def put_json(self, name: str, payload: Any, source: str) -> None:
        """``payload`` as indented JSON, every string in it masked."""
        self.put_bytes(name, json_bytes(masking.mask_tree(payload, self.masker)), source)

    def put_text(self, name: str, text: str, source: str) -> None:
        self.put_bytes(name, self.masker.mask(text).encode("utf-8", "surrogateescape"), source)

    def mask_file(self, raw: Path, masked: Path) -> Path:
        """Write ``raw`` (a spool file of ours) masked into ``masked``, a piece at a time; bytes that are
        not UTF-8 stay as they were. Returns ``masked``."""
        decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        stream = self.masker.stream()
        with raw.open("rb") as source, masked.open("wb") as out:
            while piece := source.read(_MASK_PIECE_BYTES):
                out.write(stream.feed(decoder.decode(piece)).encode("utf-8", "surrogateescape"))
            rest = stream.feed(decoder.decode(b"", final=True)) + stream.close()
            out.write(rest.encode("utf-8", "surrogateescape"))
        return masked


def json_bytes(payload: Any) -> bytes:
    return (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode("utf-8")


@dataclass
class Scene:
    """What the cluster answered so far."""

    namespace: str
    job_name: str
    run_id: str
    attempt: int
    spool: Path
    job: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    logs: dict[tuple[str, str, bool], Path] = field(default_factory=dict)
    volume_log: tuple[str, Path] | None = None  # (item name, spool) of the entrypoint's log
    crash_report: Path | None = None  # the spooled crash-report.json from the volume
    supervised_pod: str | None = None  # the pod the supervisor ended on, when it saw one
    # several nodes: the files of every node's folder triage reads (item name -> masked spool), and
    # the attempt's headless Service
    node_files: dict[str, Path] = field(default_factory=dict)
    service: dict[str, Any] | None = None
    kind: str = "Job"  # or "PyTorchJob"

    def sorted_events(self) -> list[dict[str, Any]]:
        return sorted(self.events.values(), key=lambda e: (event_time(e), str((e.get("metadata") or {}).get("name"))))

    def main_pod(self) -> dict[str, Any] | None:
        """The pod the attempt ended on: the supervised one while it exists, else the newest."""
        pinned = [p for p in self.pods if (p.get("metadata") or {}).get("name") == self.supervised_pod]
        return pinned[0] if pinned and self.supervised_pod else (self.pods[-1] if self.pods else None)

    def node(self) -> str | None:
        """The main pod's node; for a pod already gone, the node its last Scheduled event names."""
        pod = self.main_pod()
        if pod is not None:
            return (pod.get("spec") or {}).get("nodeName")
        for event in reversed(self.sorted_events()):
            message = str(event.get("message") or "")
            if event.get("reason") == "Scheduled" and " to " in message:
                return message.rsplit(" to ", 1)[1].strip() or None  # "Successfully assigned ns/pod to node"
        return None


def event_key(event: Mapping[str, Any]) -> str:
    meta = event.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _scrub_container(container: dict[str, Any]) -> None:
    for var in container.get("env") or ():
        if isinstance(var, dict) and isinstance(var.get("value"), str):
            var["value"] = REDACTED if is_secret_name(str(var.get("name"))) else redact_text(var["value"])
    for key in ("command", "args"):
        if isinstance(container.get(key), list):
            container[key] = redact_argv([str(a) for a in container[key]])


def _scrub_pod_spec(spec: Any) -> None:
    if not isinstance(spec, dict):
        return
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or ():
            if isinstance(container, dict):
                _scrub_container(container)


def scrub(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a Job or Pod with secret-looking env values, flags and URL passwords as ``***``."""
    clean = copy.deepcopy(dict(obj))
    annotations = (clean.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict) and _LAST_APPLIED in annotations:
        annotations[_LAST_APPLIED] = REDACTED  # a copy of the spec as applied, secrets included
    spec = clean.get("spec")
    if isinstance(spec, dict):
        _scrub_pod_spec(spec)
        _scrub_pod_spec((spec.get("template") or {}).get("spec"))
    return clean




@dataclass(frozen=True)
class ClusterFacts:
    """What triage needs from the cluster's evidence of one attempt.

    Attributes:
        namespace, job_name: The attempt's Job.
        pod_name, container, node: The newest pod, its training container, the node it ran on.
        exit_code, signal: How the training container ended (None if it never did).
        reason: The most telling reason: the pod's (Evicted, ...), the Job's DeadlineExceeded,
            the container's termination reason (OOMKilled, ...) or waiting reason (ErrImagePull).
        message: The message that goes with the reason.
        termination_message: The training container's termination message, if it left one.
        conditions: The pod's and the Job's conditions, in wire form.
        events: Every event collected, oldest first, in wire form.
        log_item: The manifest name of the log triage should read.
        log_path: A local copy of that log, where one was kept.
    """

    namespace: str
    job_name: str
    pod_name: str | None = None
    container: str | None = None
    node: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    message: str = ""
    termination_message: str | None = None
    conditions: tuple[Mapping[str, Any], ...] = ()
    events: tuple[Mapping[str, Any], ...] = ()
    log_item: str | None = None
    log_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["conditions"] = [dict(c) for c in self.conditions]
        data["events"] = [dict(e) for e in self.events]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterFacts:
        """The facts as `to_dict` wrote them; a field of the wrong type reads as absent."""
        def text(key: str) -> str | None:
            return as_text(data.get(key))

        return cls(text("namespace") or "", text("job_name") or "", pod_name=text("pod_name"),
                   container=text("container"), node=text("node"), exit_code=as_int(data.get("exit_code")),
                   signal=as_int(data.get("signal")), reason=text("reason"), message=text("message") or "",
                   termination_message=text("termination_message"), conditions=as_wires(data.get("conditions")),
                   events=as_wires(data.get("events")), log_item=text("log_item"), log_path=text("log_path"))

    def with_log(self, path: str | None) -> ClusterFacts:
        return replace(self, log_path=path)


def as_text(value: Any) -> str | None:
    """A field read back from a kept JSON file: a string, else None."""
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    """A field read back from a kept JSON file: an integer (not a boolean), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_list(value: Any) -> list[Any]:
    """A field read back from a kept JSON file: a list, else an empty one."""
    return value if isinstance(value, list) else []


def as_wires(value: Any) -> tuple[Mapping[str, Any], ...]:
    """A field read back from a kept JSON file: the objects of a list (conditions, events), else none."""
    return tuple(v for v in as_list(value) if isinstance(v, Mapping))


def terminated_state(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    state = status.get("state") or {}
    return state.get("terminated") or (status.get("lastState") or {}).get("terminated")


def pod_reason(pod: Mapping[str, Any], job: Mapping[str, Any] | None, status: Mapping[str, Any]) -> tuple[str | None, str]:
    job_failed = next((c for c in ((job or {}).get("status") or {}).get("conditions") or ()
                       if c.get("type") == "Failed" and c.get("status") == "True"), None)
    done, waiting = terminated_state(status) or {}, blocking_wait(pod, (status.get("state") or {}).get("waiting") or {})
    pod_status = pod.get("status") or {}
    candidates: list[tuple[object, object]] = [(pod_status.get("reason"), pod_status.get("message"))]
    if job_failed and job_failed.get("reason") == "DeadlineExceeded":
        candidates.append((job_failed.get("reason"), job_failed.get("message")))
    if done.get("reason") not in (None, "Error", "Completed"):
        candidates.append((done.get("reason"), done.get("message")))
    candidates += [(waiting.get("reason"), waiting.get("message")), (done.get("reason"), done.get("message"))]
    if job_failed:
        candidates.append((job_failed.get("reason"), job_failed.get("message")))
    for reason, message in candidates:
        if reason:
            return str(reason), str(message or "")
    return None, ""


def _log_choice(s: Scene, pod: str | None, container: str | None) -> tuple[str | None, Path | None]:
    if s.volume_log is not None:
        return s.volume_log
    for previous in (False, True):
        spool = s.logs.get((pod or "", container or "", previous))
        if spool is not None:
            kind = "previous.log" if previous else "log"
            return f"kubernetes/pods/{pod}/logs/{container}.{kind}", spool
    return None, None


def facts_of(s: Scene) -> ClusterFacts:
    """The triage facts from what was collected (the main pod's training container decides)."""
    pod = s.main_pod()
    conditions = list(((s.job or {}).get("status") or {}).get("conditions") or ())
    events = tuple(s.sorted_events())
    if pod is None:
        reason, message = pod_reason({}, s.job, {})
        log_item, log_path = _log_choice(s, None, None)
        return ClusterFacts(s.namespace, s.job_name, node=s.node(), reason=reason, message=message,
                            conditions=tuple(conditions), events=events, log_item=log_item,
                            log_path=str(log_path) if log_path else None)
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    container = str((training_container(spec) or {}).get("name") or "") or None
    cstatus: Mapping[str, Any] = next(
        (cs for cs in status.get("containerStatuses") or () if cs.get("name") == container), {})
    done = terminated_state(cstatus) or {}
    reason, message = pod_reason(pod, s.job, cstatus)
    log_item, log_path = _log_choice(s, str(pod["metadata"]["name"]), container)
    exit_code = done.get("exitCode")
    signal = done.get("signal") or (exit_code - 128 if isinstance(exit_code, int) and exit_code > 128 else None)
    return ClusterFacts(
        s.namespace, s.job_name, pod_name=str(pod["metadata"]["name"]), container=container,
        node=spec.get("nodeName"), exit_code=exit_code, signal=signal, reason=reason, message=message,
        termination_message=done.get("message") or None,
        conditions=tuple([*(status.get("conditions") or ()), *conditions]), events=events,
        log_item=log_item, log_path=str(log_path) if log_path else None,
    )
