"""The two kinds of object an attempt can be: a batch/v1 Job (an Indexed Job on several nodes) or a
Kubeflow PyTorchJob, and everything that differs between them, in one place.

How one is written, created, read, deleted, resumed and given a TTL; the resource its watch follows
and the condition that says it succeeded; which pods are its own and each pod's node rank. The rest
of the backend (supervision, evidence, triage) is the same for both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes import indexed, manifests, pytorchjob
from trainguard.core.backends.kubernetes.api import KubeApi

Wire = dict[str, Any]
JOB, PYTORCHJOB = "Job", pytorchjob.KIND


def manifest(settings: manifests.JobSettings, launch: Launch, config_map: str, spread: str | None = None) -> Wire:
    """The attempt's object, of the kind the settings name."""
    if settings.job_kind == PYTORCHJOB:
        return pytorchjob.manifest(settings, launch, config_map, spread)
    return manifests.job_manifest(settings, launch, config_map, spread)


def resource(kind: str) -> str:
    """What the supervisor's first watch follows."""
    return "pytorchjobs" if kind == PYTORCHJOB else "jobs"


def create(api: KubeApi, namespace: str, body: Mapping[str, Any]) -> Wire:
    return api.create_pytorchjob(namespace, body) if body.get("kind") == PYTORCHJOB else api.create_job(namespace, body)


def read(api: KubeApi, kind: str, namespace: str, name: str) -> Wire:
    return api.read_pytorchjob(namespace, name) if kind == PYTORCHJOB else api.read_job(namespace, name)


def delete(api: KubeApi, kind: str, namespace: str, name: str, propagation: str = "Background") -> None:
    if kind == PYTORCHJOB:
        api.delete_pytorchjob(namespace, name, propagation)
    else:
        api.delete_job(namespace, name, propagation)


def resume(api: KubeApi, kind: str, namespace: str, name: str) -> None:
    """Let a suspended one start (its Service and Secret exist now)."""
    if kind == PYTORCHJOB:
        api.patch_pytorchjob(namespace, name, {"suspend": False})
    else:
        api.resume_job(namespace, name)


def suspended(job: Mapping[str, Any]) -> bool:
    spec = job.get("spec") or {}
    return bool(spec.get("suspend") or (spec.get("runPolicy") or {}).get("suspend"))


def patch_ttl(api: KubeApi, kind: str, namespace: str, name: str, ttl_seconds: int) -> None:
    if kind == PYTORCHJOB:
        api.patch_pytorchjob(namespace, name, {"ttlSecondsAfterFinished": int(ttl_seconds)})
    else:
        api.patch_job_ttl(namespace, name, ttl_seconds)


def succeeded(kind: str) -> str:
    """The condition type that says it succeeded (`Failed` says it failed, for both)."""
    return "Succeeded" if kind == PYTORCHJOB else "Complete"


def pods_selector(kind: str, name: str) -> str:
    """The label its controller puts on every pod it makes."""
    return f"{pytorchjob.LABEL}job-name={name}" if kind == PYTORCHJOB else f"job-name={name}"


def index_of(kind: str) -> Callable[[Mapping[str, Any]], int | None]:
    """A pod's node rank: its completion index, or its replica's rank."""
    return pytorchjob.index_of if kind == PYTORCHJOB else indexed.index_of


def kind_of(job: Mapping[str, Any] | None) -> str:
    return PYTORCHJOB if (job or {}).get("kind") == PYTORCHJOB else JOB


def pods_of(job: Mapping[str, Any]) -> int:
    """How many pods (nodes) the attempt's object asks for."""
    if kind_of(job) == PYTORCHJOB:
        return pytorchjob.replicas(job)
    spec = job.get("spec") or {}
    return int(spec.get("completions") or 1) if spec.get("completionMode") == "Indexed" else 1


def pod_template(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod template spec of either kind."""
    if kind_of(job) == PYTORCHJOB:
        return pytorchjob.pod_template(job)
    spec = ((job.get("spec") or {}).get("template") or {}).get("spec")
    return spec if isinstance(spec, Mapping) else None


def index_from_name(kind: str, pod_name: str, job_name: str) -> int | None:
    """A gone pod's node rank from its name: `<job>-<index>-<random>`, or `<job>-master-0`/`<job>-worker-<n>`."""
    if kind != PYTORCHJOB:
        return indexed.index_from_name(pod_name, job_name)
    rest = pod_name.removeprefix(f"{job_name}-")
    kind_part, _, number = rest.rpartition("-")
    if rest == pod_name or not number.isdigit() or kind_part not in ("master", "worker"):
        return None
    return int(number) + (1 if kind_part == "worker" else 0)
