"""The Kubernetes objects trainguard writes for an attempt: its Job and the entrypoint ConfigMap.

Pure functions from frozen settings and a `Launch` to wire-form dicts; nothing here talks to a
cluster. The Job never retries by itself (`backoffLimit: 0`, `restartPolicy: Never`): the flow alone
owns retries. A `podFailurePolicy` fails it at once on exit codes no retry can cure and ignores
disruptions (`DisruptionTarget`), which the flow classifies as `preempted`.

The container runs `python3 /trainguard/entrypoint/trainguard-entrypoint.pyz -- <command>`: the
stdlib-only entrypoint travels as a zipapp in a ConfigMap, so a user's image needs only a Python 3
(`JobSettings.python` names it, for images where it is not `python3` on the PATH).
The attempt's log, cores and crash report go to the attempt volume (a PVC by default, hostPath or
emptyDir allowed) in the attempt's folder under `ATTEMPTS_MOUNT` (`workspace.attempt_dir`); checkpoints go to a PVC every
attempt of the run shares, under `CHECKPOINTS_MOUNT/<run id>`, so checkpoint paths read the same
in every attempt.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from trainguard_entrypoint.notice import NOTICE_GRACE_ENV
from trainguard_entrypoint.redact import declared_secret_names

from trainguard.core import ids
from trainguard.core.backends import workspace
from trainguard.core.backends.base import Launch, Rendezvous, container_env
from trainguard.core.backends.forensics import StackCapture
from trainguard.core.backends.kubernetes import indexed
from trainguard.core.backends.kubernetes.zipapp import ENTRYPOINT_FILE
from trainguard.core.policy import MAX_MEMORY_FACTOR

Wire = dict[str, Any]

CONTAINER = "train"
ENTRYPOINT_MOUNT = "/trainguard/entrypoint"
ATTEMPTS_MOUNT = "/trainguard/attempts"
CHECKPOINTS_MOUNT = "/trainguard/checkpoints"
TERMINATION_LOG = "/dev/termination-log"
DEFAULT_GRACE_SECONDS = 30  # the pod's own default: what the command has after the stop reaches it
ATTEMPT_VOLUME, CHECKPOINT_VOLUME, ENTRYPOINT_VOLUME, SHM_VOLUME = "trainguard-attempts", "trainguard-checkpoints", \
    "trainguard-entrypoint", "dshm"

LABEL_RUN, LABEL_ATTEMPT = "trainguard.io/run-id", "trainguard.io/attempt"
LABEL_COMPONENT = "app.kubernetes.io/component"
_DNS = re.compile(r"[^a-z0-9-]+")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


@dataclass(frozen=True)
class AttemptVolume:
    """Where the attempt's log, cores and crash report land: `pvc` (default), `hostPath` or `emptyDir`."""

    kind: str = "pvc"
    claim_name: str = "trainguard-attempts"
    host_path: str = "/var/lib/trainguard/attempts"

    def volume(self) -> Wire:
        """The pod volume, named `ATTEMPT_VOLUME`."""
        if self.kind == "pvc":
            return {"name": ATTEMPT_VOLUME, "persistentVolumeClaim": {"claimName": self.claim_name}}
        if self.kind == "hostPath":
            return {"name": ATTEMPT_VOLUME, "hostPath": {"path": self.host_path, "type": "DirectoryOrCreate"}}
        if self.kind == "emptyDir":
            return {"name": ATTEMPT_VOLUME, "emptyDir": {}}
        raise ValueError(f"attempt volume kind {self.kind!r}: use pvc, hostPath or emptyDir")


@dataclass(frozen=True)
class JobSettings:
    """What a platform engineer sets once per cluster (the backend block's fields, as plain values)."""

    image: str
    namespace: str = "default"
    image_pull_policy: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    cpu_request: str | None = None
    cpu_limit: str | None = None
    memory_request: str | None = None
    memory_limit: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    priority_class: str | None = None
    service_account: str | None = None
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    shm_size: str | None = "1Gi"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    job_template: Mapping[str, Any] | None = None
    attempt_volume: AttemptVolume = AttemptVolume()
    checkpoint_claim: str = "trainguard-checkpoints"
    fail_job_exit_codes: tuple[int, ...] = (2, 126, 127)
    python: str = "python3"  # the interpreter the entrypoint, the collector and the lister run with
    # The attempt's own folder only (a subPath): no job reads or rewrites another run's raw log, or
    # plants a symlink where another attempt's collector looks. False mounts every run's folders.
    attempt_sub_path: bool = True
    # Training never calls the API: no token unless asked (then the service account decides).
    automount_service_account_token: bool = False
    # The ranks' stacks before a stop; native frames only with SYS_PTRACE, which is opt-in.
    stack_sweep_seconds: float = 30.0
    sys_ptrace: bool = False
    # Several nodes: hold failed pods (backoffLimitPerIndex, Kubernetes 1.29+), else backoffLimit 0;
    # one pod per node by pod anti-affinity (opt-in); the port the ranks meet on at the first pod.
    hold_mode: bool = True
    one_pod_per_node: bool = False
    master_port: int = 29500
    job_kind: str = "Job"  # or "PyTorchJob": the same pods, handed to Kubeflow's training operator


def job_name(run_id: str, attempt: int) -> str:
    """`tg-<run id>-a<n>`, a valid DNS label; long run ids are cut and given a hash so names stay unique."""
    base = _DNS.sub("-", f"tg-{run_id.lower()}").strip("-")
    suffix = f"-a{attempt}"
    if len(base) + len(suffix) > 52:  # pods add "-xxxxx"; job-name labels must stay <= 63
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        base = f"{base[: 52 - len(suffix) - 9].rstrip('-')}-{digest}"
    return base + suffix


def secret_name(run_id: str, attempt: int) -> str:
    """The attempt's Secret (its `secret_env` values): `<job name>-env`."""
    return f"{job_name(run_id, attempt)}-env"


def secret_env(launch: Launch) -> dict[str, str]:
    """The launch's variables that hold secrets: those `TRAINGUARD_SECRET_NAMES` declares."""
    declared = declared_secret_names(launch.env)
    return {name: value for name, value in launch.env.items() if name in declared}


def secret_key(name: str) -> str:
    """The Secret's key for variable `name`: the name itself where a key may be spelled so."""
    if _SECRET_KEY.fullmatch(name) and len(name) <= 253:
        return name
    return "env-" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def secret_manifest(settings: JobSettings, launch: Launch, job: Mapping[str, Any]) -> Wire | None:
    """The attempt's Secret, owned by its Job (the garbage collector deletes it with the Job); None
    when the launch has no secrets. Immutable: nothing changes what a running attempt was given."""
    values = secret_env(launch)
    if not values:
        return None
    meta = job.get("metadata") or {}
    owner = {"apiVersion": job.get("apiVersion") or "batch/v1", "kind": job.get("kind") or "Job",
             "name": meta.get("name"), "uid": meta.get("uid")}
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
        "metadata": {"name": secret_name(launch.run_id, launch.attempt), "namespace": settings.namespace,
                     "labels": labels_for(settings, launch.run_id, launch.attempt, component="secret-env"),
                     "ownerReferences": [owner]},
        "data": {secret_key(name): base64.b64encode(value.encode("utf-8", "surrogateescape")).decode("ascii")
                 for name, value in sorted(values.items())},
    }


def workspace_path(run_id: str, attempt: int) -> str:
    """The attempt's folder on the attempt volume, as the containers see it."""
    return workspace.attempt_dir(ATTEMPTS_MOUNT, run_id, attempt)


def checkpoint_path(run_id: str) -> str:
    """The run's checkpoint folder, the same for every attempt."""
    return f"{CHECKPOINTS_MOUNT}/{run_id}"


def selector(run_id: str, attempt: int | None = None) -> str:
    """The label selector of a run's (or one attempt's) Jobs and pods."""
    parts = [f"{LABEL_RUN}={run_id}"] + ([f"{LABEL_ATTEMPT}={attempt}"] if attempt is not None else [])
    return ",".join(parts)


def labels_for(settings: JobSettings, run_id: str, attempt: int, component: str = "training") -> dict[str, str]:
    """The user's labels plus app.kubernetes.io/* and the run id and attempt."""
    return {**settings.labels, "app.kubernetes.io/name": "trainguard", "app.kubernetes.io/managed-by": "trainguard",
            "app.kubernetes.io/instance": _label_value(run_id), LABEL_COMPONENT: component,
            LABEL_RUN: _label_value(run_id), LABEL_ATTEMPT: str(attempt)}


def job_manifest(settings: JobSettings, launch: Launch, entrypoint_config_map: str,
                 spread: str | None = None) -> Wire:
    """The attempt's Job, with `settings.job_template` merged over it (the user has the last word).

    With two or more nodes it is an Indexed Job (see ``indexed``); ``spread`` then overrides how the
    pods keep to one per node (`indexed.PREFERRED` where required would leave one unschedulable).
    """
    labels = labels_for(settings, launch.run_id, launch.attempt)
    job: Wire = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name(launch.run_id, launch.attempt), "namespace": settings.namespace,
                     "labels": labels, "annotations": dict(settings.annotations)},
        "spec": {
            "backoffLimit": 0,
            "podFailurePolicy": pod_failure_policy(settings),
            "template": {"metadata": {"labels": labels, "annotations": dict(settings.annotations)},
                         "spec": pod_spec(settings, launch, entrypoint_config_map)},
        },
    }
    if launch.deadline_seconds:
        job["spec"]["activeDeadlineSeconds"] = max(1, math.ceil(launch.deadline_seconds))
    if secret_env(launch):
        # no pod before its Secret exists: created suspended, resumed once the Secret (which names
        # the Job's uid as its owner) is there
        job["spec"]["suspend"] = True
    if launch.nodes > 1:
        wanted = spread or (indexed.REQUIRED if settings.one_pod_per_node else None)
        indexed.shape(job, launch.nodes, hold=settings.hold_mode, spread=wanted)
    return deep_merge(job, settings.job_template) if settings.job_template else job


def pod_failure_policy(settings: JobSettings) -> Wire:
    """Ignore disruptions (the flow retries them); fail at once on exit codes no retry can cure."""
    rules: list[Wire] = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    if settings.fail_job_exit_codes:
        rules.append({"action": "FailJob", "onExitCodes": {
            "containerName": CONTAINER, "operator": "In", "values": sorted(set(settings.fail_job_exit_codes))}})
    return {"rules": rules}


def pod_spec(settings: JobSettings, launch: Launch, entrypoint_config_map: str) -> Wire:
    """The training pod: one container under the entrypoint, the volumes, the placement."""
    spec: Wire = {
        "restartPolicy": "Never",
        "containers": [container(settings, launch)],
        "volumes": volumes(settings, entrypoint_config_map),
    }
    optional = {"nodeSelector": dict(settings.node_selector), "tolerations": [dict(t) for t in settings.tolerations],
                "priorityClassName": settings.priority_class, "serviceAccountName": settings.service_account,
                "imagePullSecrets": [{"name": s} for s in settings.image_pull_secrets],
                "affinity": avoid_nodes_affinity(launch.avoid_nodes)}
    spec.update({key: value for key, value in optional.items() if value})
    if not settings.automount_service_account_token:
        spec["automountServiceAccountToken"] = False
    spec["terminationGracePeriodSeconds"] = termination_grace(settings, launch)
    return spec


def termination_grace(settings: JobSettings, launch: Launch) -> int:
    """The pod's terminationGracePeriodSeconds: the spec's notice grace (default 30 s, the pod's own
    default), plus the stack sweep, which the entrypoint runs before it passes the stop on.

    It is the whole time from the kubelet's SIGTERM to its SIGKILL (no preStop hook takes a share):
    the entrypoint takes the stacks, then writes the notice with the notice grace to go
    (`NOTICE_GRACE_ENV`), so its deadline is at the grace's end or before it.
    """
    return notice_grace(launch) + (math.ceil(settings.stack_sweep_seconds) if settings.stack_sweep_seconds > 0 else 0)


def notice_grace(launch: Launch) -> int:
    """Whole seconds the training has from the notice to the SIGKILL: the spec's, else the pod default's 30."""
    return math.ceil(launch.notice_grace_seconds) if launch.notice_grace_seconds else DEFAULT_GRACE_SECONDS


def container(settings: JobSettings, launch: Launch) -> Wire:
    """The training container: the entrypoint zipapp around the user's command."""
    # One node meets on the pod's own loopback, by the name the kubelet's /etc/hosts gives every pod
    # for IPv4 and IPv6 alike: c10d's store client asks for an IPv6 address first and retries that
    # until its timeout, so a resolver that maps no numeric 127.0.0.1 to IPv6 would stall it.
    meeting = indexed.rendezvous(job_name(launch.run_id, launch.attempt), settings.master_port) \
        if launch.nodes > 1 else Rendezvous(master_addr="localhost", master_port=settings.master_port)
    env = container_env(launch, workspace=workspace_path(launch.run_id, launch.attempt),
                        checkpoint_dir=checkpoint_path(launch.run_id), rendezvous=meeting,
                        capture=StackCapture(settings.stack_sweep_seconds, native=settings.sys_ptrace))
    env["TRAINGUARD_TERMINATION_LOG"] = TERMINATION_LOG
    # The kubelet's SIGTERM reaches the entrypoint (PID 1), which takes the stacks (at most the sweep)
    # and then gives notice with this long to go: the pod's grace less the sweep, so the deadline is
    # never past the SIGKILL (reason "terminated": a pod cannot tell an eviction from a deletion; the
    # flow reads which from its DisruptionTarget condition).
    env[NOTICE_GRACE_ENV] = str(notice_grace(launch))
    secrets = frozenset(secret_env(launch))
    mounts = [{"name": ENTRYPOINT_VOLUME, "mountPath": ENTRYPOINT_MOUNT, "readOnly": True},
              attempt_mount(settings, launch.run_id, launch.attempt),
              # subPath: the kubelet creates the run's folder, and the run sees only its own
              {"name": CHECKPOINT_VOLUME, "mountPath": checkpoint_path(launch.run_id), "subPath": launch.run_id}]
    if settings.shm_size:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    body: Wire = {
        "name": CONTAINER, "image": settings.image,
        "command": [settings.python, f"{ENTRYPOINT_MOUNT}/{ENTRYPOINT_FILE}", "--", *launch.command],
        "env": [env_var(k, v, launch, secrets) for k, v in sorted(env.items())],
        "resources": resources(settings, launch),
        "volumeMounts": mounts + [dict(m) for m in settings.volume_mounts],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if launch.workdir:
        body["workingDir"] = launch.workdir
    if settings.image_pull_policy:
        body["imagePullPolicy"] = settings.image_pull_policy
    if settings.sys_ptrace:  # py-spy's native frames (and its reads where the runtime forbids them without it)
        body["securityContext"] = {"capabilities": {"add": ["SYS_PTRACE"]}}
    return body


def env_var(name: str, value: str, launch: Launch, secrets: frozenset[str]) -> Wire:
    """A plain variable, or, for one of `secrets`, a reference to the attempt's Secret: a value
    written into the Job would be read by anyone who may `get` Jobs or pods, and kept in etcd
    backups and audit logs."""
    if name not in secrets:
        return {"name": name, "value": value}
    ref = {"name": secret_name(launch.run_id, launch.attempt), "key": secret_key(name)}
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def attempt_mount(settings: JobSettings, run_id: str, attempt: int) -> Wire:
    """The attempt volume in the training container: its own folder by subPath (the kubelet makes
    it), at the path it has under `ATTEMPTS_MOUNT`, or the whole volume when the settings say so."""
    if not settings.attempt_sub_path:
        return {"name": ATTEMPT_VOLUME, "mountPath": ATTEMPTS_MOUNT}
    return {"name": ATTEMPT_VOLUME, "mountPath": workspace_path(run_id, attempt),
            "subPath": ids.attempt_path(run_id, attempt)}


def resources(settings: JobSettings, launch: Launch) -> Wire:
    """Requests and limits; GPUs as `nvidia.com/gpu`; memory scaled by `launch.memory_factor`."""
    factor = min(max(launch.memory_factor, 1.0), MAX_MEMORY_FACTOR)
    requests = {"cpu": settings.cpu_request, "memory": scale_quantity(settings.memory_request, factor)}
    limits = {"cpu": settings.cpu_limit, "memory": scale_quantity(settings.memory_limit, factor)}
    if launch.gpus:
        limits["nvidia.com/gpu"] = str(launch.gpus)
    return {key: {k: v for k, v in part.items() if v} for key, part in (("requests", requests), ("limits", limits))
            if any(part.values())}


def volumes(settings: JobSettings, entrypoint_config_map: str) -> list[Wire]:
    """The entrypoint ConfigMap, the attempt volume, the run's checkpoint PVC, /dev/shm, the user's."""
    found: list[Wire] = [
        {"name": ENTRYPOINT_VOLUME, "configMap": {"name": entrypoint_config_map, "defaultMode": 0o444}},
        settings.attempt_volume.volume(),
        {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": settings.checkpoint_claim}},
    ]
    if settings.shm_size:
        found.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}})
    return found + [dict(v) for v in settings.volumes]


_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def node_name(text: str) -> bool:
    """Whether ``text`` can name a Node (a DNS-1123 subdomain): anything else names none."""
    return len(text) <= 253 and _NODE_NAME.fullmatch(text) is not None


def avoid_nodes_affinity(nodes: tuple[str, ...]) -> Wire | None:
    """Required node anti-affinity keeping the pod off `nodes`, by the Node's own name.

    `matchFields` on `metadata.name` is exact, where the `kubernetes.io/hostname` label may differ
    from the name; it takes one value per requirement, and the requirements of a term all hold.
    What cannot name a Node is left out: the API refuses it (1.32+), or no node then fits.
    """
    names = sorted({node for node in nodes if node_name(node)})
    if not names:
        return None
    fields = [{"key": "metadata.name", "operator": "NotIn", "values": [name]} for name in names]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": fields}]}}}


def scale_quantity(quantity: str | None, factor: float) -> str | None:
    """`quantity` times `factor`, in whole bytes (`16Gi` * 1.5 = `25769803776`); unchanged at 1."""
    if quantity is None or factor == 1.0:
        return quantity
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", quantity.strip())
    if not match or match.group(2) not in (*_UNITS, ""):
        raise ValueError(f"memory {quantity!r}: not a Kubernetes quantity; write e.g. 16Gi or 512Mi")
    unit = _UNITS.get(match.group(2)) or 1
    return str(int(Decimal(match.group(1)) * unit * Decimal(str(factor))))


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> Wire:
    """`override` merged into a copy of `base`: mappings recursively, anything else replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _label_value(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63].strip("-._")
    return cleaned or "x"
