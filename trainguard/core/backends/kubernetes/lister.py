"""The checkpoint lister: a short-lived pod that reads a run's checkpoint folder on its PVC.

The flow's machine does not see the checkpoint claim, so a pod of the training image mounts it
read-only, with the entrypoint ConfigMap the Job runs from, and runs the same selection the local
and Slurm backends run here (`trainguard_entrypoint.resumable`, imported from the zipapp with the
image's Python in isolated mode): the checkpoints ranked newest first, the newest checked against
their acknowledgements (a mismatched one left out, with why; hashing held to a time bound), the
acknowledgements (briefly) and the helper's progress. It prints that as one JSON line, which the
backend reads through the pod's log (`parse`: the image is the user's, so every field is checked
again here); the pod is always deleted afterwards.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from trainguard_entrypoint import acks, resumable, safefiles

from trainguard.core.backends.capabilities import CheckpointListing
from trainguard.core.backends.kubernetes import manifests
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.errors import KubeError
from trainguard.core.backends.kubernetes.podstate import START_ERRORS, container_state, printable
from trainguard.core.backends.kubernetes.watch import RELISTED, ResumingWatch
from trainguard.core.backends.kubernetes.zipapp import ENTRYPOINT_FILE

# isolated (-I): neither the image's PYTHONPATH nor its working folder can put another module first
_BOOT = ("import sys\n"
         "sys.path.insert(0, sys.argv[1])\n"
         "from trainguard_entrypoint.resumable import main\n"
         "sys.exit(main(sys.argv[2:]))\n")
LOG_LIMIT_BYTES = 16 * 1024 * 1024  # far above a listing's answer (at most `resumable.MAX_LISTED` names)
_REASON_CHARS = 1000


def run(api: KubeApi, job: manifests.JobSettings, run_id: str, folder: str, timeout_seconds: float, *,
        config_map: str, verify_seconds: float) -> CheckpointListing:
    """Run a lister pod over the run's checkpoint folder and return what it read.

    ``config_map`` is the entrypoint's (it must exist); ``verify_seconds`` bounds the pod's hashing,
    and the pod may take ``timeout_seconds`` more to start and list.

    Raises:
        KubeError: The pod could not be created or read.
        TimeoutError: It did not finish in time, or cannot start.
        ValueError: Its answer is not a listing (the message says why).
    """
    name = f"tg-ckpt-{uuid.uuid4().hex[:10]}"
    labels = {**manifests.labels_for(job, run_id, 0, component="checkpoint-lister")}
    labels.pop(manifests.LABEL_ATTEMPT)
    command = [job.python, "-I", "-c", _BOOT, f"{manifests.ENTRYPOINT_MOUNT}/{ENTRYPOINT_FILE}", folder,
               manifests.CHECKPOINTS_MOUNT, f"{verify_seconds:g}"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "containers": [{"name": "list", "image": job.image, "command": command,
                        "volumeMounts": [{"name": manifests.CHECKPOINT_VOLUME,
                                          "mountPath": manifests.CHECKPOINTS_MOUNT, "readOnly": True},
                                         {"name": manifests.ENTRYPOINT_VOLUME,
                                          "mountPath": manifests.ENTRYPOINT_MOUNT, "readOnly": True}],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}}],
        "volumes": [{"name": manifests.CHECKPOINT_VOLUME,
                     "persistentVolumeClaim": {"claimName": job.checkpoint_claim}},
                    {"name": manifests.ENTRYPOINT_VOLUME, "configMap": {"name": config_map, "defaultMode": 0o444}}],
        **({"nodeSelector": dict(job.node_selector)} if job.node_selector else {}),
        **({"tolerations": [dict(t) for t in job.tolerations]} if job.tolerations else {}),
        **({"imagePullSecrets": [{"name": s} for s in job.image_pull_secrets]} if job.image_pull_secrets else {}),
    }}
    api.create_pod(job.namespace, pod)
    try:
        _wait_done(api, job.namespace, name, timeout_seconds + verify_seconds)
        return parse(api.read_pod_log(job.namespace, name, "list", limit_bytes=LOG_LIMIT_BYTES))
    finally:
        try:
            api.delete_pod(job.namespace, name, grace_seconds=0)
        except KubeError:
            pass


def parse(log: bytes) -> CheckpointListing:
    """The listing in the lister's log (its last line), every field checked: the pod ran the user's image.

    Raises:
        ValueError: The last line is not a listing, or the lister says it failed.
    """
    lines = [line for line in log.splitlines() if line.strip()]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("version") != resumable.LISTING_FORMAT:
        tail = printable(lines[-1][:300]) if lines else "nothing"
        raise ValueError(f"the checkpoint lister printed no listing (its last line: {tail!r})")
    if answer.get("error") is not None:
        raise ValueError(f"the checkpoint lister failed: {_line(answer.get('error'))}")
    names: list[str] = []
    for item in _items(answer.get("checkpoints"), resumable.MAX_LISTED):
        name = item[0] if isinstance(item, list) and item else None
        if _entry(name) and name not in names:
            names.append(str(name))
    briefs = {name: brief for name, payload in list(_mapping(answer.get("acks")).items())[:resumable.MAX_BRIEFS]
              if _entry(name) for brief in (acks.AckBrief.parse(payload, name),) if brief is not None}
    notes = [_line(note) for note in _items(answer.get("notes"), 16)]
    if answer.get("absent"):
        notes.insert(0, _line(answer["absent"]))
    return CheckpointListing(
        checkpoints=tuple(names), acks=briefs, progress=acks.parse_progress(answer.get("progress")),
        left_out=_reasons(answer.get("left_out")), unchecked=_reasons(answer.get("unchecked")), notes=tuple(notes))


def _entry(name: object) -> bool:
    """A name that can be a checkpoint entry of the folder (not a path, a dot-name or a temporary file)."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name and "\0" not in name
            and not name.startswith(".") and not name.endswith(resumable.IGNORED_SUFFIXES))


def _items(value: object, limit: int) -> list[Any]:
    return value[:limit] if isinstance(value, list) else []


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _line(value: object) -> str:
    return printable(str(value)[:_REASON_CHARS].encode("utf-8", "replace"))


def _reasons(value: object) -> tuple[tuple[str, str], ...]:
    """(name spelled printably, why) pairs from the pod's ``[{name, reason}]``."""
    return tuple((safefiles.safe_name(str(item.get("name"))[:255]), _line(item.get("reason")))
                 for item in _items(value, resumable.MAX_LISTED) if isinstance(item, dict))


def _wait_done(api: KubeApi, namespace: str, name: str, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    watch = ResumingWatch(api, "pods", namespace, f"{manifests.LABEL_COMPONENT}=checkpoint-lister",
                          timeout_seconds=10)
    for event in watch:
        pods = (event["object"].get("items") or []) if event["type"] == RELISTED else [event["object"]]
        mine = [p for p in pods if p["metadata"]["name"] == name]
        if any(p.get("status", {}).get("phase") in ("Succeeded", "Failed") for p in mine):
            return
        waiting = {container_state(p, "list").get("waiting", {}).get("reason") for p in mine}
        if waiting & START_ERRORS:  # the image cannot be pulled: it never will be in time
            raise TimeoutError(f"checkpoint lister {name} cannot start: {sorted(waiting & START_ERRORS)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"checkpoint lister {name} did not finish")
