"""Freezing what the cluster knows about one attempt, before anything of it is deleted.

Runs in the flow's ``finally``, before the Job is deleted or given its TTL. Into the store, under
``runs/{run_id}/attempt-{n}/``, goes: the Job and every pod of it as JSON; the current and the
previous log of every container (init containers and sidecars too), streamed through spool
files in bounded memory; the events of the Job, its pods and their nodes, sorted by time; a
`kubectl describe`-style text per pod; each node's conditions and allocatable resources; the
termination message; and the files the entrypoint left on the attempt's volume (log, crash
report, snapshots, core dumps, the checkpoint listing), read back through a collector pod and
named as the local collector names them, so `trainguard evidence show` reads both alike.

Collection never raises: each piece that cannot be had is a `MissingItem` with the reason (pod
already gone, no previous instance, API error). The facts triage needs are stored as
``kubernetes/triage.json`` and, with the log, kept on this machine, where ``kept`` reads them back.
Talking to the API is ``api``'s job; the collector pod is ``collector``'s; the describe text is
``describe``'s.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from trainguard.core import masking
from trainguard.core.backends.kubernetes import collector, kinds, localdir, nodes
from trainguard.core.backends.workspace import KEPT_LOG, KEPT_NODE_MAP, TRIAGE_FACTS
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.describe import describe_pod
from trainguard.core.backends.kubernetes.errors import Forbidden, KubeError, NotFound
from trainguard.core.backends.kubernetes.scene import (
    KUBERNETES,
    ClusterWriter,
    ClusterFacts,
    Scene,
    event_key,
    facts_of,
    json_bytes,
    scrub,
)
from trainguard.core.backends.kubernetes.volume import store_volume_files
from trainguard.core.evidence.manifest import Manifest, attempt_prefix, store_manifest
from trainguard.core.stores.base import EvidenceStore

FLOW = "flow"
NODE_EVENTS_NAMESPACE = "default"  # the kubelet and node controller record node events there
TRIAGE_NAME = "kubernetes/triage.json"
__all__ = ["collect_kubernetes_evidence"]


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _gone(kind: str, name: str, exc: KubeError) -> str:
    if isinstance(exc, NotFound):
        return (f"{kind} {name} is gone: deleted (by a TTL, a person or a controller) before evidence "
                f"was collected ({exc})")
    return f"API error: {exc}"


def _collect_job(c: ClusterWriter, s: Scene) -> None:
    try:
        s.job = kinds.read(c.api, s.kind, s.namespace, s.job_name)
    except KubeError as exc:
        c.absent("kubernetes/job.json", KUBERNETES, _gone(s.kind, s.job_name, exc))
        return
    c.put_json("kubernetes/job.json", scrub(s.job), KUBERNETES)


def _list_events(c: ClusterWriter, s: Scene, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    try:
        items = list(c.api.list_events(namespace, field_selector=selector).get("items") or ())
    except Forbidden as exc:
        where = "namespace default, where node events live" if kind == "Node" else f"namespace {namespace}"
        c.absent(f"kubernetes/events.json ({kind} {name})", KUBERNETES,
                 f"events of {kind} {name}: forbidden ({exc}); grant `events: list` in {where}")
        return []
    except KubeError as exc:
        c.absent(f"kubernetes/events.json ({kind} {name})", KUBERNETES, f"events of {kind} {name}: API error: {exc}")
        return []
    for event in items:
        s.events.setdefault(event_key(event), event)
    return items


def _collect_pods(c: ClusterWriter, s: Scene) -> None:
    job_events = _list_events(c, s, s.namespace, s.kind, s.job_name)
    created = {str(e.get("message", "")).removeprefix("Created pod: ") for e in job_events
               if e.get("reason") in ("SuccessfulCreate", "SuccessfulCreatePod")}  # the Job's, the operator's
    try:
        listed = c.api.list_pods(s.namespace, label_selector=kinds.pods_selector(s.kind, s.job_name)).get("items") or []
    except KubeError as exc:
        c.absent("kubernetes/pods", KUBERNETES, f"the Job's pods could not be listed: API error: {exc}")
        return
    s.pods = sorted(listed, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    present = {str((p.get("metadata") or {}).get("name")) for p in s.pods}
    for name in sorted(created - present):
        _list_events(c, s, s.namespace, "Pod", name)
        c.absent(f"kubernetes/pods/{name}.json", KUBERNETES,
                 f"pod {name} of {s.kind} {s.job_name} is gone: deleted (by the Job's TTL, a person, the garbage "
                 "collector or pod GC) before evidence was collected; its logs went with it, its events remain")
    if not s.pods and not created:
        c.absent("kubernetes/pods", KUBERNETES, f"no pod of {s.kind} {s.job_name} exists: never created, or deleted")
    for pod in s.pods:
        name = str(pod["metadata"]["name"])
        c.guarded(f"kubernetes/pods/{name}.json", KUBERNETES, partial(_collect_pod, c, s, pod))


def _containers(pod: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any] | None]]:
    """(name, status) of every container of the pod: init containers, containers, ephemeral ones."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    found: list[tuple[str, Mapping[str, Any] | None]] = []
    for key, status_key in (("initContainers", "initContainerStatuses"), ("containers", "containerStatuses"),
                            ("ephemeralContainers", "ephemeralContainerStatuses")):
        statuses = {cs.get("name"): cs for cs in status.get(status_key) or () if isinstance(cs, Mapping)}
        found.extend((str(ct.get("name")), statuses.get(ct.get("name"))) for ct in spec.get(key) or ()
                     if isinstance(ct, Mapping))
    return found


def _collect_pod(c: ClusterWriter, s: Scene, pod: dict[str, Any]) -> None:
    name = str(pod["metadata"]["name"])
    c.put_json(f"kubernetes/pods/{name}.json", scrub(pod), KUBERNETES)
    _list_events(c, s, s.namespace, "Pod", name)
    if node := (pod.get("spec") or {}).get("nodeName"):
        s.nodes.setdefault(str(node), None)
    for container, status in _containers(pod):
        _collect_logs(c, s, name, container, status)


def _collect_logs(c: ClusterWriter, s: Scene, pod: str, container: str, status: Mapping[str, Any] | None) -> None:
    base = f"kubernetes/pods/{pod}/logs/{container}"
    for previous, name in ((False, f"{base}.log"), (True, f"{base}.previous.log")):
        restarts = int((status or {}).get("restartCount") or 0)
        had_previous = restarts > 0 or bool(((status or {}).get("lastState") or {}).get("terminated"))
        if previous and not had_previous:
            c.absent(name, KUBERNETES, "no previous instance: the container never restarted")
            continue
        raw = s.spool / f"{len(s.logs)}.{'previous' if previous else 'current'}.raw"
        try:
            c.api.save_pod_log(s.namespace, pod, container, previous=previous, out=raw)
            spool = c.mask_file(raw, raw.with_suffix(".log"))  # the raw log stays only on the cluster
        except KubeError as exc:
            c.absent(name, KUBERNETES, f"not readable: {exc}")
            continue
        except OSError as exc:
            c.absent(name, KUBERNETES, f"could not spool the log: {exc}")
            continue
        finally:
            raw.unlink(missing_ok=True)
        c.put_file(name, spool, KUBERNETES)
        s.logs[(pod, container, previous)] = spool


def _collect_nodes(c: ClusterWriter, s: Scene) -> None:
    for node in sorted(s.nodes):
        try:
            obj = c.api.read_node(node)
        except KubeError as exc:
            c.absent(f"kubernetes/nodes/{node}.json", KUBERNETES, _gone("node", node, exc))
        else:
            s.nodes[node] = obj
            status = obj.get("status") or {}
            summary = {"name": node, "conditions": status.get("conditions") or [],
                       "allocatable": status.get("allocatable") or {}, "capacity": status.get("capacity") or {},
                       "taints": (obj.get("spec") or {}).get("taints") or [],
                       "unschedulable": bool((obj.get("spec") or {}).get("unschedulable")),
                       "labels": (obj.get("metadata") or {}).get("labels") or {},
                       "nodeInfo": status.get("nodeInfo") or {}}
            c.put_json(f"kubernetes/nodes/{node}.json", summary, KUBERNETES)
        _list_events(c, s, NODE_EVENTS_NAMESPACE, "Node", node)


def _collect_events_and_describe(c: ClusterWriter, s: Scene) -> None:
    events = s.sorted_events()
    c.put_json("kubernetes/events.json", events, KUBERNETES)
    for pod in s.pods:
        meta = pod.get("metadata") or {}
        own = [e for e in events if (e.get("involvedObject") or {}).get("kind") == "Pod"
               and (e.get("involvedObject") or {}).get("name") == meta.get("name")]
        text = describe_pod(pod, own, now=c.now())
        c.put_text(f"kubernetes/pods/{meta.get('name')}/describe.txt", text, KUBERNETES)


def _collect_service(c: ClusterWriter, s: Scene) -> None:
    """The headless Service of a multi-node attempt (its pods' DNS names), or why it is not there."""
    try:
        s.service = c.api.read_service(s.namespace, s.job_name)
    except KubeError as exc:
        c.absent("kubernetes/service.json", KUBERNETES, _gone("Service", s.job_name, exc))
        return
    c.put_json("kubernetes/service.json", s.service, KUBERNETES)


def _map_nodes(c: ClusterWriter, s: Scene, kept_dir: Path | None) -> None:
    """``attempt.json`` (each node rank's pod, node, end and evidence) and, with ``kept_dir``, each
    node's files kept there for triage."""
    mapped = nodes.map_attempt(c, s)
    if kept_dir is not None:
        try:
            nodes.keep_nodes(c, s, mapped, kept_dir)
        except OSError as exc:
            c.absent(f"{kept_dir}/{KEPT_NODE_MAP}", KUBERNETES, f"could not keep the nodes' files locally: {exc}")


def _collect_termination_message(c: ClusterWriter, s: Scene, facts: ClusterFacts) -> None:
    if facts.termination_message:
        c.put_text("termination-message.txt", facts.termination_message, KUBERNETES)
    elif facts.pod_name is None:
        c.absent("termination-message.txt", KUBERNETES, "no pod of the Job is left to carry one")
    else:
        why = "it has not terminated" if facts.exit_code is None else "it wrote none and the policy kept no log"
        c.absent("termination-message.txt", KUBERNETES,
                 f"container {facts.container} of pod {facts.pod_name} has no termination message: {why}")


def _collect_volume(c: ClusterWriter, s: Scene, budget_bytes: int, timeout_seconds: float) -> None:
    store_volume_files(c, s, budget_bytes=budget_bytes, start_timeout_seconds=timeout_seconds)


def _put_extra(c: ClusterWriter, name: str, data: object) -> None:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"extra[{name!r}] must be bytes, got {type(data).__name__}")
    c.put_bytes(name, bytes(data), FLOW)


def _keep_for_triage(c: ClusterWriter, s: Scene, facts: ClusterFacts, kept_dir: Path | None) -> ClusterFacts:
    """Store the triage facts; with ``kept_dir``, also keep them and the attempt's log there."""
    if kept_dir is not None:
        try:
            localdir.ensure_private(kept_dir)
            if facts.log_path:
                log = kept_dir / KEPT_LOG
                localdir.copy_private(facts.log_path, log)
                facts = facts.with_log(str(log))
            localdir.write_private(kept_dir / TRIAGE_FACTS, json_bytes(masking.mask_tree(facts.to_dict(), c.masker)))
        except OSError as exc:
            c.absent(f"{kept_dir}/{TRIAGE_FACTS}", KUBERNETES, f"could not keep the triage facts locally: {exc}")
            facts = facts.with_log(None)
    c.put_json(TRIAGE_NAME, {**facts.to_dict(), "log_path": None}, KUBERNETES)
    return facts


def collect_kubernetes_evidence(
    api: KubeApi, namespace: str, job_name: str, run_id: str, attempt: int, store: EvidenceStore, *,
    extra: Mapping[str, bytes] | None = None, kept_dir: Path | None = None,
    copy_budget_bytes: int = collector.DEFAULT_BUDGET_BYTES, collector_timeout_seconds: float = 120.0,
    now: Callable[[], datetime] = _utc_now, pod: str | None = None, kind: str = "Job",
    local_problem: str | None = None,
) -> Manifest:
    """Freeze everything the cluster knows about one attempt's Job into ``store``; write the manifest.

    Never raises: each piece that cannot be had is a `MissingItem` with the reason. If the
    manifest itself cannot be stored, the returned manifest lists ``manifest.json`` as missing.

    Args:
        api: The cluster.
        namespace: The Job's namespace.
        job_name: The attempt's Job.
        run_id: The run, for the store's key prefix.
        attempt: The attempt number.
        store: Where the evidence goes, under ``runs/{run_id}/attempt-{n}/``.
        extra: More items by name (e.g. the flow's ``classification.json``).
        kept_dir: A local folder to keep the triage facts and the attempt's log in, for triage
            (``kept`` reads them); nothing is kept locally when None.
        copy_budget_bytes: At most this many bytes of the volume's files are copied; larger files
            are listed as missing with where they stay.
        collector_timeout_seconds: How long the collector pod may take to start.
        now: The clock for ``collected_at`` stamps and describe ages.
        kind: What the attempt is: a `Job`, or a Kubeflow `PyTorchJob` (its pods are the operator's).
        pod: The pod the attempt ended on, as its supervisor saw it: it supplies the triage facts,
            the termination message and the node, even when a newer pod replaced it (after a
            disruption the Job ignored). The newest pod when None or gone.
        local_problem: Why nothing can be kept locally (``kept_dir`` is None then), for the manifest.
    """
    c = ClusterWriter(api, store, attempt_prefix(run_id, attempt), now)
    with tempfile.TemporaryDirectory(prefix="trainguard-kube-evidence-") as tmp:
        s = Scene(namespace=namespace, job_name=job_name, run_id=run_id, attempt=attempt, spool=Path(tmp),
                  supervised_pod=pod, kind=kind)
        steps: list[tuple[str, Callable[[], None]]] = [
            ("kubernetes/job.json", lambda: _collect_job(c, s)),
            ("kubernetes/pods", lambda: _collect_pods(c, s)),
            ("kubernetes/nodes", lambda: _collect_nodes(c, s)),
            ("kubernetes/events.json", lambda: _collect_events_and_describe(c, s)),
            ("volume", lambda: _collect_volume(c, s, copy_budget_bytes, collector_timeout_seconds)),
        ]
        for name, step in steps:
            c.guarded(name, KUBERNETES, step)
        several = nodes.multi_node(s)
        if several and s.kind == kinds.JOB:  # a PyTorchJob's Services are the operator's, one per replica
            c.guarded("kubernetes/service.json", KUBERNETES, lambda: _collect_service(c, s))
        facts = facts_of(s)
        c.guarded("termination-message.txt", KUBERNETES, lambda: _collect_termination_message(c, s, facts))
        c.guarded(TRIAGE_NAME, KUBERNETES, lambda: _keep_for_triage(c, s, facts, kept_dir))
        if local_problem:
            c.absent(f"{TRIAGE_FACTS} (kept on this machine)", KUBERNETES, local_problem)
        if several:
            c.guarded(KEPT_NODE_MAP, KUBERNETES, lambda: _map_nodes(c, s, kept_dir))
        for name, data in (extra or {}).items():
            c.guarded(str(name), FLOW, partial(_put_extra, c, str(name), data))
    manifest = Manifest(run_id, attempt, now().isoformat(), tuple(c.items), tuple(c.missing))
    return store_manifest(store, manifest, KUBERNETES)
