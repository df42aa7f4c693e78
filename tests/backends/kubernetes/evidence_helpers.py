"""The Jobs the evidence tests fail, and readers for what collection stored.

`trainguard_job` is the very Job trainguard writes (manifests.job_manifest, the entrypoint as a
zipapp from its ConfigMap, workspace and checkpoints on PVCs); `training_job` is a hand-made one
for shapes trainguard never writes (an init container that restarts under OnFailure).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainguard.core.backends.base import ERROR, AttemptOutcome, Launch
from trainguard.core.backends.kubernetes import errors, kept, manifests, zipapp
from trainguard.core.backends.kubernetes.scene import ClusterFacts
from trainguard.core.triage.signals import Signals
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.evidence.manifest import Manifest
from trainguard.core.stores.folder import LocalEvidenceStore

REPO = str(Path(__file__).resolve().parents[3])
WORKSPACE = "/trainguard/attempt"
CHECKPOINTS = "/trainguard/checkpoints"
IMAGE = "python:3.11"


def trainguard_job(kube: KubeApi, ns: str, script: str, *, run_id: str = "run-1", image: str = IMAGE,
                   attempt_volume: str = "pvc") -> str:
    """Create the Job trainguard writes for `script` (attempt 1 of `run_id`); return its name."""
    try:
        kube.create_config_map(ns, zipapp.config_map(ns))
    except errors.Conflict:
        pass  # a second Job in the same namespace shares it
    volume = manifests.AttemptVolume(kind=attempt_volume, claim_name=f"{ns}-attempts",
                                      host_path=f"/var/lib/trainguard-tests/{ns}")
    settings = manifests.JobSettings(image=image, namespace=ns, shm_size=None, attempt_volume=volume,
                                     checkpoint_claim=f"{ns}-checkpoints")
    launch = Launch(run_id=run_id, attempt=1, command=("python", "-u", "-c", script),
                    env={"HF_TOKEN": "hf_secret_value"})
    body = manifests.job_manifest(settings, launch, zipapp.config_map_name())
    kube.create_job(ns, body)
    return str(body["metadata"]["name"])


def training_job(name: str, script: str, *, run_id: str, image: str = IMAGE, volumes: bool = True,
                 restart: str = "Never", backoff: int = 0, init: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Job whose container runs `script` under the entrypoint, workspace and checkpoints on PVCs."""
    env = [{"name": "TRAINGUARD_RUN_ID", "value": run_id}, {"name": "TRAINGUARD_ATTEMPT", "value": "1"},
           {"name": "PYTHONPATH", "value": REPO}, {"name": "HF_TOKEN", "value": "hf_secret_value"}]
    container: dict[str, Any] = {
        "name": "train", "image": image, "terminationMessagePolicy": "FallbackToLogsOnError",
        "command": ["python", "-m", "trainguard_entrypoint", "--", "python", "-u", "-c", script],
        "env": env,
    }
    spec: dict[str, Any] = {"restartPolicy": restart, "terminationGracePeriodSeconds": 1,
                            "containers": [container]}
    if volumes:
        env += [{"name": "TRAINGUARD_WORKSPACE", "value": WORKSPACE},
                {"name": "TRAINGUARD_CHECKPOINT_DIR", "value": CHECKPOINTS}]
        container["volumeMounts"] = [{"name": "attempt", "mountPath": WORKSPACE},
                                     {"name": "checkpoints", "mountPath": CHECKPOINTS}]
        spec["volumes"] = [{"name": "attempt", "persistentVolumeClaim": {"claimName": f"{name}-attempt"}},
                           {"name": "checkpoints", "persistentVolumeClaim": {"claimName": f"{run_id}-ckpt"}}]
    if init:
        spec["initContainers"] = [init]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": backoff, "template": {"spec": spec}}}


def kept_facts(folder: Path) -> ClusterFacts:
    """The triage facts collection kept in ``folder``, read back as the backend reads them."""
    facts = kept.read_facts(folder)
    assert facts is not None, f"no triage facts kept in {folder}"
    return facts


def kept_signals(folder: Path, run_id: str = "run-1") -> Signals:
    """What the backend hands triage from what collection kept in ``folder`` (attempt 1 of ``run_id``), for a
    Job its supervisor saw fail with the Job's bare verdict: the pod's kept facts say why."""
    return kept.read(folder, run_id, 1).signals(AttemptOutcome(None, None, ERROR, "the Job failed"))


def pods_of(kube: KubeApi, ns: str, job: str) -> list[dict[str, Any]]:
    return list(kube.list_pods(ns, label_selector=f"job-name={job}").get("items") or [])


def job_failed(kube: KubeApi, ns: str, job: str) -> bool:
    conditions = (kube.read_job(ns, job).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Failed" and c.get("status") == "True" for c in conditions)


def collectors(kube: KubeApi, ns: str) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/component=evidence-collector"
    return list(kube.list_pods(ns, label_selector=selector).get("items") or [])


class Kept:
    """What one collection stored: the manifest, item bytes by name, missing reasons by name."""

    def __init__(self, store: LocalEvidenceStore, manifest: Manifest) -> None:
        self.store, self.manifest = store, manifest
        self.items = {item.name: item for item in manifest.items}
        self.missing: dict[str, list[str]] = {}
        for miss in manifest.missing:
            self.missing.setdefault(miss.name, []).append(miss.reason)

    def read(self, name: str) -> bytes:
        return self.store.get_bytes(self.items[name].key)

    def json(self, name: str) -> Any:
        return json.loads(self.read(name))

    def names(self, prefix: str) -> list[str]:
        return sorted(n for n in self.items if n.startswith(prefix))

    def why(self, name: str) -> str:
        return " | ".join(self.missing.get(name, []))
