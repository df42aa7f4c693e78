"""The checkpoint lister: a short-lived pod that lists a run's checkpoint folder on its PVC.

The flow's machine does not see the checkpoint claim, so a pod of the training image mounts it
read-only and prints the folder's entries with their times as JSON, which the backend reads
through the pod's log and ranks; the pod is always deleted afterwards. An empty file (a full
disk leaves those) is no checkpoint to resume from.
"""

from __future__ import annotations

import time
import uuid

from trainguard.core.backends.kubernetes import manifests
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.errors import KubeError
from trainguard.core.backends.kubernetes.podstate import START_ERRORS, container_state
from trainguard.core.backends.kubernetes.watch import RELISTED, ResumingWatch

_LISTER = (
    "import json, os, sys\n"
    "d = sys.argv[1]\n"
    "names = sorted(os.listdir(d)) if os.path.isdir(d) else []\n"
    "stats = [(n, os.stat(os.path.join(d, n))) for n in names]\n"
    "# an empty file (a full disk leaves those) is no checkpoint to resume from\n"
    "print(json.dumps([[n, s.st_mtime] for n, s in stats if s.st_size or os.path.isdir(os.path.join(d, n))]))\n"
)


def run(api: KubeApi, job: manifests.JobSettings, run_id: str, folder: str, timeout_seconds: float) -> str:
    """Run a lister pod over the run's checkpoint folder and return its output (a JSON list on the last line).

    Raises:
        KubeError: The pod could not be created or read.
        TimeoutError: It did not finish within ``timeout_seconds``, or cannot start.
    """
    name = f"tg-ckpt-{uuid.uuid4().hex[:10]}"
    labels = {**manifests.labels_for(job, run_id, 0, component="checkpoint-lister")}
    labels.pop(manifests.LABEL_ATTEMPT)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "containers": [{"name": "list", "image": job.image, "command": [job.python, "-c", _LISTER, folder],
                        "volumeMounts": [{"name": manifests.CHECKPOINT_VOLUME,
                                          "mountPath": manifests.CHECKPOINTS_MOUNT, "readOnly": True}],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}}],
        "volumes": [{"name": manifests.CHECKPOINT_VOLUME,
                     "persistentVolumeClaim": {"claimName": job.checkpoint_claim}}],
        **({"nodeSelector": dict(job.node_selector)} if job.node_selector else {}),
        **({"tolerations": [dict(t) for t in job.tolerations]} if job.tolerations else {}),
        **({"imagePullSecrets": [{"name": s} for s in job.image_pull_secrets]} if job.image_pull_secrets else {}),
    }}
    api.create_pod(job.namespace, pod)
    try:
        _wait_done(api, job.namespace, name, timeout_seconds)
        return api.read_pod_log(job.namespace, name, "list").decode("utf-8", errors="replace")
    finally:
        try:
            api.delete_pod(job.namespace, name, grace_seconds=0)
        except KubeError:
            pass

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
