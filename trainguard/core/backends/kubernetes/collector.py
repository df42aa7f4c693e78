"""The collector pod: reads an attempt's volume after its training pod is gone, through the pod's log.

A training pod that was OOM-killed, evicted or deleted can no longer be asked for its files, but
the volumes it wrote to (a PVC, or a hostPath on its node) outlive it. A short-lived pod mounts
the same volumes, read-only (a subPath mount as its whole volume, at the mount point the subPath
hangs from, so that the program walks every folder down to the attempt's itself, following no
link), and prints the attempt's folder as a gzipped tar, base64 in lines between bounded records,
on stdout: the log subresource is the one read channel the orchestrator's RBAC already has (no
exec, no port-forward). ``collector_output`` follows that log into a spool file in bounded memory
and checks the length and SHA-256 the pod printed last. The pod is always deleted afterwards.

What to mount and which folder to read come from the Job's own pod template: the training
container's `TRAINGUARD_WORKSPACE`/`TRAINGUARD_CHECKPOINT_DIR` and the volumes that hold them.
Turning the tar into evidence items is ``evidence``'s job.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.collector_output import decode  # re-exported: the reader's entry
from trainguard.core.backends.kubernetes.collector_program import script
from trainguard.core.backends.kubernetes.describe import safe
from trainguard.core.backends.kubernetes.errors import KubeError, NotFound
from trainguard.core.backends.kubernetes.manifests import LABEL_COMPONENT
from trainguard.core.backends.kubernetes.zipapp import ENTRYPOINT_FILE

CONTAINER = "collect"
COMPONENT = "evidence-collector"
COLLECTS_LABEL = "trainguard.io/collects"
DEFAULT_BUDGET_BYTES = 256 * 1024 * 1024
DEFAULT_COPY_TIMEOUT_SECONDS = 600.0  # the pod itself is stopped after 900 s (activeDeadlineSeconds)
DEFAULT_PYTHON = "python3"
NODE_CHECK_SECONDS = 3.0  # while a collector bound to a node waits to start, how often that node is looked at

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
    workspace_root: str | None = None  # the collector's mount point the workspace is reached from
    checkpoint_root: str | None = None


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
    own = [(m, *collector_mount(m)) for m in mounts if m.get("name") in names]
    read_only = tuple({str(m["mountPath"]): m for _, m, _ in own}.values())
    return Plan(workspace, checkpoint_dir, image, read_only, tuple(keep), any("hostPath" in v for v in keep),
                python=python, workspace_root=_root_of(workspace, own), checkpoint_root=_root_of(checkpoint_dir, own))


def collector_mount(mount: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The collector's read-only mount for one of the training container's, and its mount point.

    A subPath mount (the attempt's own folder) becomes its whole volume, mounted where the subPath
    hangs from: the kubelet would follow a symbolic link inside the volume to resolve a subPath, so
    the collector walks those folders itself, from the mount point, never following one.
    """
    mount_path = posixpath.normpath(str(mount.get("mountPath")))
    sub_path = posixpath.normpath(str(mount.get("subPath") or "."))
    if sub_path != "." and mount_path.endswith("/" + sub_path) and len(mount_path) > len(sub_path) + 1:
        root = mount_path[: -len(sub_path) - 1]
        return {"name": mount.get("name"), "mountPath": root, "readOnly": True}, root
    return {**mount, "readOnly": True}, mount_path


def _root_of(path: str | None, own: list[tuple[Mapping[str, Any], dict[str, Any], str]]) -> str | None:
    """The mount point of the deepest training mount holding ``path``, as the collector mounts it."""
    holding = [(len(str(m.get("mountPath"))), root) for m, _, root in own if path and _within(path, str(m.get("mountPath")))]
    return max(holding)[1] if holding else None


def pod_manifest(job: Mapping[str, Any], p: Plan, *, node: str | None, budget_bytes: int,
                 copy_timeout_seconds: float = DEFAULT_COPY_TIMEOUT_SECONDS) -> dict[str, Any]:
    """The collector pod for ``job``: same image and volumes, read-only, small, never restarted."""
    meta, template = job.get("metadata") or {}, (job.get("spec") or {}).get("template") or {}
    spec = template.get("spec") or {}
    job_name = str(meta.get("name") or "job")
    kept = {k: v for k, v in (meta.get("labels") or {}).items()
            if k.startswith(("trainguard.io/", "app.kubernetes.io/"))}  # run id and attempt, for cleanup
    labels = {**kept, "app.kubernetes.io/managed-by": "trainguard", LABEL_COMPONENT: COMPONENT,
              COLLECTS_LABEL: job_name[:63]}
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": f"{job_name[:40]}-evidence-", "labels": labels},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "activeDeadlineSeconds": 900,
            "automountServiceAccountToken": False,
            "containers": [{
                "name": CONTAINER, "image": p.image, "command": [
                    p.python, "-c", script(), p.workspace or "", p.workspace_root or p.workspace or "",
                    p.checkpoint_dir or "", p.checkpoint_root or p.checkpoint_dir or "", str(budget_bytes),
                    f"{copy_timeout_seconds:g}"],
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


class NodeUnavailable(Exception):
    """The node a collector must run on (its hostPath files are there) is gone or not Ready."""


def node_unavailable(api: KubeApi, node: str) -> str | None:
    """Why ``node`` cannot run a pod now (deleted, or its Ready condition not True), or None.

    A node that cannot be read for another reason (RBAC, a flaky API server) is not judged: the
    collector then waits out its start timeout as before.
    """
    try:
        found = api.read_node(node)
    except NotFound:
        return f"node {node} is gone (no longer in the cluster)"
    except KubeError:
        return None
    conditions = [c for c in (found.get("status") or {}).get("conditions") or () if isinstance(c, Mapping)]
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") == "True":
        return None
    why = ": ".join(safe(str(part)) for part in (ready.get("reason"), ready.get("message")) if part)
    return f"node {node} is NotReady (Ready={safe(str(ready.get('status')))}{', ' + why if why else ''})"


def wait_started(api: KubeApi, namespace: str, name: str, timeout_seconds: float,
                 clock: Callable[[], float] = time.monotonic, node: str | None = None) -> None:
    """Watch the collector pod until its container runs or ends; raise TimeoutError saying why not.

    The node the pod is bound to (``node``, or the one the scheduler chose: a local PV's node
    affinity pins it too) is looked at every few seconds: once it is gone or NotReady the pod cannot
    start, and NodeUnavailable says so instead of waiting on.
    """
    deadline = clock() + timeout_seconds
    pod = api.read_pod(namespace, name)
    while True:
        verdict = _started(pod)
        if verdict in ("started", "ended"):
            return
        if verdict:
            raise TimeoutError(f"collector pod {name} {verdict}")
        bound = node or (pod.get("spec") or {}).get("nodeName")
        if bound and (down := node_unavailable(api, str(bound))):
            raise NodeUnavailable(down)
        left = deadline - clock()
        if left <= 0:
            conditions = "; ".join(f"{c.get('type')}={c.get('status')} {c.get('message') or ''}".strip()
                                   for c in (pod.get("status") or {}).get("conditions") or ())
            raise TimeoutError(f"collector pod {name} did not start within {timeout_seconds:g}s ({conditions})")
        version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
        watch_for = min(left, NODE_CHECK_SECONDS)
        for event in api.watch("pods", namespace, resource_version=version,
                               field_selector=f"metadata.name={name}", timeout_seconds=max(1, int(watch_for))):
            if event.get("type") in ("ADDED", "MODIFIED"):
                pod = event.get("object") or pod
                if _started(pod):
                    break
            elif event.get("type") == "DELETED":
                raise TimeoutError(f"collector pod {name} was deleted before it started")


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


def _node_down(why: str) -> str:
    return (f"not read: the collector pod must run on the node that holds the attempt's volume, which cannot run "
            f"it: {why}; the files stay on that volume, and all other evidence was kept")


def fetch(api: KubeApi, namespace: str, job: Mapping[str, Any], p: Plan, spool: Path, *, node: str | None,
          budget_bytes: int = DEFAULT_BUDGET_BYTES, start_timeout_seconds: float = 120.0) -> Fetched:
    """Run a collector pod for ``job``, follow its output into ``spool``, and delete the pod.

    Never raises: what went wrong is in ``Fetched.problems``; ``tar_path`` is set only for a
    complete, verified tar. Files on a hostPath (or a local PV) live on one node: when that node is
    gone or NotReady (a lost node), no collector is started, or the one waiting to start there is given
    up, with one line saying so, rather than waiting out ``start_timeout_seconds`` for a pod that
    cannot run.
    """
    result = Fetched()
    bound = node if p.needs_node else None
    if bound and (down := node_unavailable(api, bound)):
        result.problems.append(_node_down(down))
        return result
    try:
        created = api.create_pod(namespace, pod_manifest(job, p, node=node, budget_bytes=budget_bytes))
        result.pod_name = str((created.get("metadata") or {}).get("name"))
    except KubeError as exc:
        result.problems.append(f"could not create the collector pod: {exc}")
        return result
    try:
        wait_started(api, namespace, result.pod_name, start_timeout_seconds, node=bound)
        with spool.open("wb") as out:
            stream = api.stream_pod_log(namespace, result.pod_name, CONTAINER, read_timeout_seconds=120.0)
            result.meta = decode(stream, out)
        result.tar_path = spool
    except NodeUnavailable as exc:
        result.problems.append(_node_down(str(exc)))
    except (KubeError, TimeoutError, ValueError, OSError) as exc:
        result.problems.append(f"collector pod {result.pod_name}: {exc}{_ended(api, namespace, result.pod_name)}")
    finally:
        try:
            api.delete_pod(namespace, result.pod_name, grace_seconds=0)
        except KubeError as exc:
            result.problems.append(f"could not delete collector pod {result.pod_name} (delete it by hand): {exc}")
    return result
