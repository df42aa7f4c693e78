"""Freezing what the cluster knows about one attempt, before anything of it is deleted.

Into the store, under ``runs/{run_id}/attempt-{n}/``: the Job and its pods as JSON, the training
container's current and previous log, and the events of the Job and its pods sorted by time;
``kubernetes/triage.json`` holds the facts triage needs. With ``log_dir`` those facts and the log
are also kept on the flow's machine, where `KubernetesBackend.signals` reads them after the Job is
gone. Collection never raises: each piece that cannot be had is a `MissingItem` with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainguard.core.kube import manifests
from trainguard.core.kube.api import KubeApi
from trainguard.core.kube.errors import KubeError
from trainguard.core.manifest import Manifest, ManifestItem, MissingItem, attempt_prefix, write_manifest
from trainguard.core.stores import EvidenceStore

KUBERNETES = "kubernetes"
TRIAGE_NAME = "kubernetes/triage.json"


def _now() -> datetime:
    return datetime.now(UTC)


class _Kept:
    def __init__(self, store: EvidenceStore, prefix: str, now: Callable[[], datetime]) -> None:
        self.store, self.prefix, self.now = store, prefix, now
        self.items: list[ManifestItem] = []
        self.missing: list[MissingItem] = []

    def put(self, name: str, data: bytes, source: str = KUBERNETES) -> None:
        try:
            stored = self.store.put_bytes(f"{self.prefix}/{name}", data)
        except Exception as exc:
            self.missing.append(MissingItem(name, source, f"could not store it: {type(exc).__name__}: {exc}"))
            return
        self.items.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, source,
                                       self.now().isoformat()))

    def absent(self, name: str, reason: str) -> None:
        self.missing.append(MissingItem(name, KUBERNETES, reason))


def _json(payload: Any) -> bytes:
    return (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _event_time(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


def _events(api: KubeApi, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    return list(api.list_events(namespace, selector).get("items") or [])


def _pods(kept: _Kept, api: KubeApi, namespace: str, run_id: str, attempt: int) -> list[dict[str, Any]]:
    try:
        pods = list(api.list_pods(namespace, manifests.selector(run_id, attempt)).get("items") or [])
    except KubeError as exc:
        kept.absent("kubernetes/pods", f"could not list the pods: {exc}")
        return []
    if not pods:
        kept.absent("kubernetes/pods", "no pod of the attempt is left (deleted, or never created)")
    for pod in pods:
        kept.put(f"kubernetes/pods/{pod['metadata']['name']}.json", _json(pod))
    return pods


def _logs(kept: _Kept, api: KubeApi, namespace: str, pod: str) -> bytes | None:
    current: bytes | None = None
    for previous in (False, True):
        name = f"kubernetes/logs/{pod}/{manifests.CONTAINER}{'.previous' if previous else ''}.log"
        try:
            data = api.read_pod_log(namespace, pod, manifests.CONTAINER, previous=previous)
        except KubeError as exc:
            kept.absent(name, str(exc))
            continue
        kept.put(name, data)
        current = data if not previous else current
    return current


def collect_kubernetes_evidence(
    api: KubeApi, namespace: str, job_name: str, run_id: str, attempt: int, store: EvidenceStore, *,
    extra: Mapping[str, bytes] | None = None, log_dir: Path | None = None, now: Callable[[], datetime] = _now,
) -> Manifest:
    """Freeze the Job, its pods, the training log and the events into `store`; never raises."""
    kept = _Kept(store, attempt_prefix(run_id, attempt), now)
    job: dict[str, Any] | None = None
    try:
        job = api.read_job(namespace, job_name)
        kept.put("kubernetes/job.json", _json(job))
    except KubeError as exc:
        kept.absent("kubernetes/job.json", str(exc))
    pods = _pods(kept, api, namespace, run_id, attempt)
    log = _logs(kept, api, namespace, pods[-1]["metadata"]["name"]) if pods else None
    events: list[dict[str, Any]] = []
    for kind, name in [("Job", job_name)] + [("Pod", p["metadata"]["name"]) for p in pods]:
        try:
            events += _events(api, namespace, kind, name)
        except KubeError as exc:
            kept.absent(f"kubernetes/events/{name}", str(exc))
    events.sort(key=_event_time)
    kept.put("kubernetes/events.json", _json(events))
    facts = {"namespace": namespace, "job_name": job_name, "events": events,
             "conditions": [*((pods[-1] if pods else {}).get("status", {}).get("conditions") or []),
                            *((job or {}).get("status", {}).get("conditions") or [])]}
    kept.put(TRIAGE_NAME, _json(facts))
    _keep_locally(kept, log_dir, facts, log)
    for name, data in (extra or {}).items():
        kept.put(str(name), data, "flow")
    manifest = Manifest(run_id, attempt, now().isoformat(), tuple(kept.items), tuple(kept.missing))
    try:
        write_manifest(store, manifest)
    except Exception as exc:
        reason = f"could not store the manifest: {type(exc).__name__}: {exc}"
        return Manifest(run_id, attempt, manifest.created_at, manifest.items,
                        (*manifest.missing, MissingItem("manifest.json", KUBERNETES, reason)))
    return manifest


def _keep_locally(kept: _Kept, log_dir: Path | None, facts: dict[str, Any], log: bytes | None) -> None:
    if log_dir is None:
        return
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        if log is not None:
            (log_dir / "attempt.log").write_bytes(log)
        local = {**facts, "log_path": str(log_dir / "attempt.log") if log is not None else None}
        (log_dir / "triage.json").write_bytes(_json(local))
    except OSError as exc:
        kept.absent(f"{log_dir}/triage.json", f"could not keep the triage facts locally: {exc}")
