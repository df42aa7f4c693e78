"""The collector pod: reads an attempt's volume after its training pod is gone, through the pod's log.

A training pod that was OOM-killed, evicted or deleted can no longer be asked for its files, but
the volumes it wrote to (a PVC, or a hostPath on its node) outlive it. A short-lived pod mounts
the same volumes at the same paths, read-only, and prints the attempt's folder as a gzipped tar,
base64 in lines between marker lines, on stdout: the log subresource is the one read channel the
orchestrator's RBAC already has (no exec, no port-forward). The flow side follows that log into a
spool file in bounded memory, checks the length and SHA-256 the pod printed last, and hands back
the tar. The pod is always deleted afterwards.

What to mount and which folder to read come from the Job's own pod template: the training
container's `TRAINGUARD_WORKSPACE`/`TRAINGUARD_CHECKPOINT_DIR` and the volumes that hold them.
Turning the tar into evidence items is ``evidence``'s job.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import posixpath
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.collector_program import MAGIC, script
from trainguard.core.backends.kubernetes.describe import safe
from trainguard.core.backends.kubernetes.errors import KubeError
from trainguard.core.backends.kubernetes.zipapp import ENTRYPOINT_FILE

CONTAINER = "collect"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "evidence-collector"
COLLECTS_LABEL = "trainguard.io/collects"
DEFAULT_BUDGET_BYTES = 256 * 1024 * 1024
DEFAULT_PYTHON = "python3"
_MAX_LINE_BYTES = 64 * 1024

@dataclass(frozen=True)
class Plan:
    """Where the attempt's files are and which of the Job's volumes hold them."""

    workspace: str | None
    checkpoint_dir: str | None
    image: str | None
    mounts: tuple[Mapping[str, Any], ...]
    volumes: tuple[Mapping[str, Any], ...]
    needs_node: bool
    absent: str | None = None
    python: str = DEFAULT_PYTHON


@dataclass
class Fetched:
    """What the collector brought back: the tar (if complete), its listing, and what went wrong."""

    tar_path: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    pod_name: str | None = None


def _env(container: Mapping[str, Any], name: str) -> str | None:
    for var in container.get("env") or ():
        if isinstance(var, Mapping) and var.get("name") == name and isinstance(var.get("value"), str):
            return str(var["value"])
    return None


def training_container(template_spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container that runs the attempt: the one carrying TRAINGUARD_RUN_ID, else the first."""
    containers = [c for c in template_spec.get("containers") or () if isinstance(c, Mapping)]
    for container in containers:
        if _env(container, "TRAINGUARD_RUN_ID") is not None:
            return container
    return containers[0] if containers else None


def python_of(container: Mapping[str, Any]) -> str:
    """The interpreter the Job runs trainguard's entrypoint with (the collector uses the same one)."""
    command = [str(part) for part in container.get("command") or ()]
    if len(command) > 1 and command[1].endswith(ENTRYPOINT_FILE):
        return command[0]
    return DEFAULT_PYTHON  # a template override replaced the command: the usual name


def _within(path: str, mount_path: str) -> bool:
    path, mount_path = posixpath.normpath(path), posixpath.normpath(mount_path)
    return path == mount_path or path.startswith(mount_path.rstrip("/") + "/")


def plan(template_spec: Mapping[str, Any], workspace: str | None = None, checkpoint_dir: str | None = None) -> Plan:
    """Which volumes and paths of the Job's pod template a collector needs."""
    container = training_container(template_spec) or {}
    workspace = workspace or _env(container, "TRAINGUARD_WORKSPACE")
    checkpoint_dir = checkpoint_dir or _env(container, "TRAINGUARD_CHECKPOINT_DIR")
    image, python = container.get("image"), python_of(container)
    if not workspace:
        return Plan(None, checkpoint_dir, image, (), (), False,
                    "the Job's training container names no TRAINGUARD_WORKSPACE, so there is no folder to read",
                    python)
    volumes = {v.get("name"): v for v in template_spec.get("volumes") or () if isinstance(v, Mapping)}
    wanted = [p for p in (workspace, checkpoint_dir) if p]
    mounts = [m for m in container.get("volumeMounts") or ()
              if isinstance(m, Mapping) and any(_within(p, str(m.get("mountPath") or "/-")) for p in wanted)]
    if not any(_within(workspace, str(m.get("mountPath"))) for m in mounts):
        return Plan(workspace, checkpoint_dir, image, (), (), False,
                    f"the workspace {workspace} is on no volume of the Job's pod template: "
                    "it was in the container's own filesystem and went with it", python)
    chosen = [volumes[m.get("name")] for m in mounts if m.get("name") in volumes]
    for volume in chosen:
        if "emptyDir" in volume and any(_within(workspace, str(m.get("mountPath"))) for m in mounts
                                        if m.get("name") == volume.get("name")):
            return Plan(workspace, checkpoint_dir, image, (), (), False,
                        f"the workspace is on emptyDir volume {volume.get('name')!r}, which is deleted with "
                        "its pod; use a PVC or hostPath to keep the files of a failed pod", python)
    keep = [v for v in chosen if "emptyDir" not in v]
    names = {v.get("name") for v in keep}
    read_only = tuple({**m, "readOnly": True} for m in mounts if m.get("name") in names)
    return Plan(workspace, checkpoint_dir, image, read_only, tuple(keep), any("hostPath" in v for v in keep),
                python=python)


def pod_manifest(job: Mapping[str, Any], p: Plan, *, node: str | None, budget_bytes: int) -> dict[str, Any]:
    """The collector pod for ``job``: same image and volumes, read-only, small, never restarted."""
    meta, template = job.get("metadata") or {}, (job.get("spec") or {}).get("template") or {}
    spec = template.get("spec") or {}
    job_name = str(meta.get("name") or "job")
    kept = {k: v for k, v in (meta.get("labels") or {}).items()
            if k.startswith(("trainguard.io/", "app.kubernetes.io/"))}  # run id and attempt, for cleanup
    labels = {**kept, "app.kubernetes.io/managed-by": "trainguard", COMPONENT_LABEL: COMPONENT,
              COLLECTS_LABEL: job_name[:63]}
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": f"{job_name[:40]}-evidence-", "labels": labels},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "activeDeadlineSeconds": 900,
            "automountServiceAccountToken": False,
            "containers": [{
                "name": CONTAINER, "image": p.image, "command": [p.python, "-c", script(), p.workspace or "",
                                                                 p.checkpoint_dir or "", str(budget_bytes)],
                "volumeMounts": [dict(m) for m in p.mounts],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            }],
            "volumes": [dict(v) for v in p.volumes],
        },
    }
    for key in ("imagePullSecrets", "tolerations", "securityContext"):
        if spec.get(key):
            body["spec"][key] = spec[key]
    if p.needs_node and node:
        body["spec"]["nodeName"] = node  # a hostPath lives on one node only
    return body


def _started(pod: Mapping[str, Any]) -> str | None:
    """"started"/"ended" once the collector's log can be followed, a reason if it never will be."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return "ended"
    for cs in status.get("containerStatuses") or ():
        state = cs.get("state") or {}
        if "running" in state or "terminated" in state:
            return "started"
        waiting = (state.get("waiting") or {}).get("reason")
        if waiting in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"):
            return f"never started: {waiting}: {(state.get('waiting') or {}).get('message') or ''}".rstrip(": ")
    return None


def wait_started(api: KubeApi, namespace: str, name: str, timeout_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
    """Watch the collector pod until its container runs or ends; raise TimeoutError saying why not."""
    deadline = clock() + timeout_seconds
    pod = api.read_pod(namespace, name)
    while True:
        verdict = _started(pod)
        if verdict in ("started", "ended"):
            return
        if verdict:
            raise TimeoutError(f"collector pod {name} {verdict}")
        left = deadline - clock()
        if left <= 0:
            conditions = "; ".join(f"{c.get('type')}={c.get('status')} {c.get('message') or ''}".strip()
                                   for c in (pod.get("status") or {}).get("conditions") or ())
            raise TimeoutError(f"collector pod {name} did not start within {timeout_seconds:g}s ({conditions})")
        version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
        for event in api.watch("pods", namespace, resource_version=version,
                               field_selector=f"metadata.name={name}", timeout_seconds=max(1, int(left))):
            if event.get("type") in ("ADDED", "MODIFIED"):
                pod = event.get("object") or pod
                if _started(pod):
                    break
            elif event.get("type") == "DELETED":
                raise TimeoutError(f"collector pod {name} was deleted before it started")


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from complete
        if len(pending) > _MAX_LINE_BYTES:  # not ours: nothing we print is this long
            pending = b""
    if pending:
        yield pending


def decode(chunks: Iterator[bytes], spool: BinaryIO) -> dict[str, Any]:
    """Write the tar from the collector's output into ``spool``; return its META plus what was seen.

    Raises:
        ValueError: The output is not the collector's, or ended before its END marker, or the
            length or SHA-256 differs from what the pod printed (a rotated or cut log).
    """
    meta: dict[str, Any] | None = None
    digest, size = hashlib.sha256(), 0
    problems: list[Any] = []
    noise: list[str] = []
    for raw in _lines(chunks):
        line = raw.strip().decode("ascii", errors="replace")
        if line.startswith(MAGIC + " "):
            kind, _, rest = line[len(MAGIC) + 1:].partition(" ")
            if kind == "META":
                meta = json.loads(rest)
            elif kind == "PROBLEM":
                problems.append(json.loads(rest))
            elif kind == "END":
                told_size, _, told_digest = rest.partition(" ")
                if meta is None:
                    raise ValueError("the collector printed END without its META line")
                if int(told_size) != size or told_digest != digest.hexdigest():
                    raise ValueError(f"the tar read back has {size} bytes, the collector sent {told_size}: "
                                     f"its log was cut or rotated before it could be read{_seen(noise)}")
                meta.setdefault("problems", []).extend(problems)
                return meta
        elif meta is None and line:
            noise.append(line)
        elif line:
            try:
                data = base64.b64decode(line, validate=True)
            except (binascii.Error, ValueError):
                noise.append(line)  # stderr (a warning, a traceback): END's digest decides
                continue
            spool.write(data)
            digest.update(data)
            size += len(data)
    if meta is None:
        raise ValueError(f"the collector printed nothing trainguard can read (no META line){_seen(noise)}")
    raise ValueError(f"the collector's output ended after {size} bytes without its END marker{_seen(noise)}")


def _seen(noise: list[str]) -> str:
    """The collector's own words (its stderr), shortened, for an error message."""
    if not noise:
        return ""
    text = " / ".join(line[:200] for line in noise[-5:])
    return f"; it also printed: {safe(text)}"


def _ended(api: KubeApi, namespace: str, name: str) -> str:
    """How the collector's container ended, if it did, for an error message."""
    try:
        statuses = (api.read_pod(namespace, name).get("status") or {}).get("containerStatuses") or []
    except KubeError:
        return ""
    done = ((statuses[0] if statuses else {}).get("state") or {}).get("terminated")
    if not done:
        return ""
    return f" (its container ended: {done.get('reason')}, exit code {done.get('exitCode')}: {safe(done.get('message'))})"


def fetch(api: KubeApi, namespace: str, job: Mapping[str, Any], p: Plan, spool: Path, *, node: str | None,
          budget_bytes: int = DEFAULT_BUDGET_BYTES, start_timeout_seconds: float = 120.0) -> Fetched:
    """Run a collector pod for ``job``, follow its output into ``spool``, and delete the pod.

    Never raises: what went wrong is in ``Fetched.problems``; ``tar_path`` is set only for a
    complete, verified tar.
    """
    result = Fetched()
    try:
        created = api.create_pod(namespace, pod_manifest(job, p, node=node, budget_bytes=budget_bytes))
        result.pod_name = str((created.get("metadata") or {}).get("name"))
    except KubeError as exc:
        result.problems.append(f"could not create the collector pod: {exc}")
        return result
    try:
        wait_started(api, namespace, result.pod_name, start_timeout_seconds)
        with spool.open("wb") as out:
            stream = api.stream_pod_log(namespace, result.pod_name, CONTAINER, read_timeout_seconds=120.0)
            result.meta = decode(stream, out)
        result.tar_path = spool
    except (KubeError, TimeoutError, ValueError, OSError) as exc:
        result.problems.append(f"collector pod {result.pod_name}: {exc}{_ended(api, namespace, result.pod_name)}")
    finally:
        try:
            api.delete_pod(namespace, result.pod_name, grace_seconds=0)
        except KubeError as exc:
            result.problems.append(f"could not delete collector pod {result.pod_name} (delete it by hand): {exc}")
    return result
