"""An attempt of several nodes on Kubernetes: an Indexed Job of N pods and a headless Service.

Pure functions over wire-form dicts, used by ``manifests`` once a launch asks for two or more
nodes (one node keeps the plain Job). What belongs here: the Indexed Job's own fields (completion
mode, completions = parallelism = N, per-index back-off in hold mode, the `FailIndex` twin of the
exit-code rule), the pods' rendezvous (the index-0 pod's DNS name as the master, the node rank
from the completion index through the downward API), placement (one pod per node by pod
anti-affinity, required or preferred) and the attempt's headless Service, owned by its Job.

Hold mode (`backoffLimitPerIndex: 0`, no `maxFailedIndexes`, Kubernetes 1.29+): a failed index is
not retried and nothing else is deleted, so every survivor's log is still there when trainguard
collects it. Older clusters get `backoffLimit: 0`: the Job fails on its first failed pod and the
controller deletes the survivors, whose evidence is then taken while they terminate.
What does not belong here: the pod template itself (``manifests``), running or collecting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainguard.core.backends.base import Rendezvous

Wire = dict[str, Any]

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# Variables whose value is the pod's node rank: set from the completion index by the downward API.
NODE_RANK_VARIABLES = ("NODE_RANK", "PET_NODE_RANK", "TRAINGUARD_NODE_INDEX")
REQUIRED, PREFERRED = "required", "preferred"


def master_addr(job_name: str) -> str:
    """The index-0 pod's DNS name: `<job>-0.<service>` (the Service is named as its Job)."""
    return f"{job_name}-0.{job_name}"


def rendezvous(job_name: str, master_port: int) -> Rendezvous:
    """Where the ranks meet: the first pod, at the block's port; each pod's rank comes from its index."""
    return Rendezvous(master_addr=master_addr(job_name), master_port=master_port, node_rank=0)


def node_rank_env(name: str) -> Wire:
    """A variable holding the pod's completion index (its node rank), read through the downward API."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}}


def shape(job: Wire, nodes: int, *, hold: bool, spread: str | None) -> Wire:
    """Turn the attempt's plain Job into an Indexed Job of ``nodes`` pods (in place; returned).

    Args:
        job: The Job ``manifests`` built (its template holds the rendezvous env already).
        nodes: Pods of the attempt, one per node rank.
        hold: Hold mode (`backoffLimitPerIndex: 0`); False for clusters older than 1.29 (`backoffLimit: 0`).
        spread: `REQUIRED` or `PREFERRED` pod anti-affinity (one pod per node), or None for none.
    """
    spec, name = job["spec"], job["metadata"]["name"]
    spec.update(completionMode="Indexed", completions=nodes, parallelism=nodes)
    if hold:
        spec.pop("backoffLimit", None)  # with a per-index limit it defaults to the largest int
        spec["backoffLimitPerIndex"] = 0
        for rule in spec["podFailurePolicy"]["rules"]:
            if rule["action"] == "FailJob":
                rule["action"] = "FailIndex"  # failing the Job would delete the survivors and their logs
    # no pod before its Service: a rank that cannot resolve the master gives up on the rendezvous
    spec["suspend"] = True
    pod = spec["template"]["spec"]
    pod["subdomain"] = name
    container = pod["containers"][0]
    plain = [e for e in container["env"] if e["name"] not in NODE_RANK_VARIABLES]
    container["env"] = sorted([*plain, *map(node_rank_env, NODE_RANK_VARIABLES)], key=lambda e: str(e["name"]))
    if spread is not None:
        affinity = pod.setdefault("affinity", {})
        affinity["podAntiAffinity"] = one_pod_per_node(spec["template"]["metadata"]["labels"], spread)
    return job


def one_pod_per_node(labels: Mapping[str, str], spread: str) -> Wire:
    """Pod anti-affinity against the attempt's own pods on one hostname: required, or preferred."""
    keys = ("trainguard.io/run-id", "trainguard.io/attempt", "app.kubernetes.io/component")
    term = {"labelSelector": {"matchLabels": {k: labels[k] for k in keys if k in labels}},
            "topologyKey": "kubernetes.io/hostname"}
    if spread == REQUIRED:
        return {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    return {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}


def service_manifest(job: Mapping[str, Any]) -> Wire:
    """The attempt's headless Service, named as its Job and owned by it (it goes with the Job).

    `publishNotReadyAddresses`: the pods have no readiness probe and must find each other while
    they start; without it a pod's DNS name appears only once it is Ready.
    """
    meta = job.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    selector = {k: v for k, v in labels.items() if k.startswith("trainguard.io/") or k == "app.kubernetes.io/component"}
    owner = {"apiVersion": str(job.get("apiVersion") or "batch/v1"), "kind": str(job.get("kind") or "Job"),
             "name": meta.get("name"), "uid": meta.get("uid")}
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "labels": labels,
                     "ownerReferences": [owner]},
        "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": True},
    }


def index_of(pod: Mapping[str, Any]) -> int | None:
    """A pod's completion index (its node rank), from the annotation the Job controller sets."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(INDEX_ANNOTATION)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def index_from_name(pod_name: str, job_name: str) -> int | None:
    """The index in an Indexed Job's pod name (`<job>-<index>-<random>`), for a pod already gone."""
    rest = pod_name.removeprefix(f"{job_name}-")
    head = rest.split("-", 1)[0]
    return int(head) if rest != pod_name and head.isdigit() else None
