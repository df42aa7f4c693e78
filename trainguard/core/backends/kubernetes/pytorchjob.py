"""A multi-node attempt as a Kubeflow PyTorchJob (kubeflow.org/v1), for clusters that run the training operator.

The same pods as the Indexed Job (``manifests``, ``indexed``), handed to the operator instead: a
`Master` replica and N-1 `Worker` replicas of one pod template, `restartPolicy: Never` (no replica is
restarted: trainguard alone retries), `runPolicy.backoffLimit: 0`, and `cleanPodPolicy: None`, so a
failed replica's survivors keep running, and keep their logs, until trainguard has read them (the
operator's own hold mode). The operator names the rendezvous: `MASTER_ADDR` is the master's
Service `<job>-master-0`, `MASTER_PORT` the container's `pytorchjob-port` (the block's
`master_port`), and `WORLD_SIZE`, `RANK`, `PET_NODE_RANK`, `PET_NNODES`, `PET_NPROC_PER_NODE` follow
from the replicas and `nprocPerNode`; trainguard's own copies of them are left out, and the
entrypoint reads its node rank from `PET_NODE_RANK`. The container is named `pytorch`, as the
operator's webhook requires. Pure functions; running them is the backend's business.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes import indexed, manifests

Wire = dict[str, Any]
API_VERSION, KIND = "kubeflow.org/v1", "PyTorchJob"
CONTAINER, PORT_NAME = "pytorch", "pytorchjob-port"
LABEL = "training.kubeflow.org/"
# what the operator sets in every replica's environment (its copy comes last and would win anyway)
OPERATOR_SETS = frozenset({"MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT", "WORLD_SIZE",
                           "RANK", "PET_NODE_RANK", "PET_NNODES", "PET_NPROC_PER_NODE", *indexed.NODE_RANK_VARIABLES})


def manifest(settings: manifests.JobSettings, launch: Launch, entrypoint_config_map: str,
             spread: str | None = None) -> Wire:
    """The attempt's PyTorchJob: the Indexed Job's pod template as Master and Worker replicas."""
    job = manifests.job_manifest(settings, launch, entrypoint_config_map, spread)
    spec = job["spec"]
    template = copy.deepcopy(spec["template"])
    template["spec"].pop("subdomain", None)  # the operator makes a Service per replica
    container = template["spec"]["containers"][0]
    container["name"] = CONTAINER
    container["env"] = [e for e in container["env"] if e["name"] not in OPERATOR_SETS] + [
        {"name": "TRAINGUARD_NODE_INDEX_FROM", "value": "PET_NODE_RANK"}]
    container["ports"] = [{"name": PORT_NAME, "containerPort": settings.master_port}]
    replica = {"replicas": 1, "restartPolicy": "Never", "template": template}
    replicas = {"Master": replica}
    if launch.nodes > 1:
        replicas["Worker"] = {**copy.deepcopy(replica), "replicas": launch.nodes - 1}
    run_policy: Wire = {"backoffLimit": 0, "cleanPodPolicy": "None"}
    if spec.get("activeDeadlineSeconds"):
        run_policy["activeDeadlineSeconds"] = spec["activeDeadlineSeconds"]
    if manifests.secret_env(launch):
        run_policy["suspend"] = True  # no pod before its Secret exists (operator v1.7 and later)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": job["metadata"],
            "spec": {"runPolicy": run_policy, "nprocPerNode": str(launch.processes_per_node),
                     "pytorchReplicaSpecs": replicas}}


def index_of(pod: Mapping[str, Any]) -> int | None:
    """A replica's node rank: the master's 0, worker N's N+1 (as the operator sets `RANK`)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    kind, index = labels.get(f"{LABEL}replica-type"), str(labels.get(f"{LABEL}replica-index") or "")
    if not index.isdigit() or kind not in ("master", "worker"):
        return None
    return int(index) + (1 if kind == "worker" else 0)


def replicas(job: Mapping[str, Any]) -> int:
    """Pods of the job: every replica spec's count."""
    specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    return sum(int((r or {}).get("replicas") or 1) for r in specs.values())


def pod_template(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The master's pod template spec (every replica has the same one)."""
    master = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get("Master") or {}
    spec = (master.get("template") or {}).get("spec")
    return spec if isinstance(spec, Mapping) else None
