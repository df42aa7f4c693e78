"""Kubeflow PyTorchJob (kubeflow.org/v1): the CRD's defaults, its webhook's checks, and what the
training operator makes of one replica: the pod and the headless Service.

Emulates kubeflow/training-operator v1.9.0 (the last v1 release; v1.8 sets the same variables):
pkg/apis/kubeflow.org/v1/pytorch_defaults.go (cleanPodPolicy None, replicas 1, restartPolicy
OnFailure, the `pytorchjob-port` 23456 on the `pytorch` container, nprocPerNode "auto"),
pkg/webhooks/pytorch/pytorchjob_webhook.go, pkg/controller.v1/pytorch/envvar.go and master.go
(PYTHONUNBUFFERED, MASTER_PORT/PET_MASTER_PORT, MASTER_ADDR/PET_MASTER_ADDR = `<job>-master-0`,
WORLD_SIZE = replicas x nprocPerNode (1 for "auto"), RANK = PET_NODE_RANK = the pod's index, +1
for workers, PET_NPROC_PER_NODE, PET_NNODES), and pkg/controller.v1/common pod.go/service.go
(pod and Service `<job>-<type>-<index>`, the operator's labels, ownerReferences).

Not emulated: the `init-pytorch` init container the operator adds to workers (an alpine
`nslookup` loop needing real cluster DNS), elastic policies (PET_RDZV_*), gang scheduling.
The reconcile loop and status are pytorchjob.py's.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from kubesim.errors import Forbidden

OPERATOR = "pytorchjob-controller"
WEBHOOK = "validator.pytorchjob.training-operator.kubeflow.org"
PORT_NAME, DEFAULT_PORT, CONTAINER = "pytorchjob-port", 23456, "pytorch"
TYPES = ("Master", "Worker")
LABEL = "training.kubeflow.org/"
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def default(job: dict[str, Any]) -> None:
    """SetDefaults_PyTorchJob, in place."""
    spec = job.setdefault("spec", {})
    spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "None")
    specs = spec.get("pytorchReplicaSpecs") or {}
    for key in list(specs):
        camel = next((t for t in TYPES if t.lower() == key.lower()), key)
        specs[camel] = specs.pop(key)
    for replica in specs.values():
        if not isinstance(replica, dict):
            continue
        replica.setdefault("replicas", 1)
        replica.setdefault("restartPolicy", "OnFailure")
        containers = ((replica.setdefault("template", {}).setdefault("spec", {}))
                      .get("containers") or [])
        index = next((i for i, c in enumerate(containers) if c.get("name") == CONTAINER), 0)
        if containers and not any(p.get("name") == PORT_NAME
                                  for p in containers[index].get("ports") or []):
            containers[index].setdefault("ports", []).append(
                {"name": PORT_NAME, "containerPort": DEFAULT_PORT})
    if not (spec.get("elasticPolicy") or {}).get("nProcPerNode"):
        spec.setdefault("nprocPerNode", "auto")
    job.pop("status", None)  # the status subresource is the operator's to write


def _errors(job: dict[str, Any]) -> list[str]:
    name = (job.get("metadata") or {}).get("name") or ""
    found = []
    if name and not _DNS1035.match(name):
        found.append(f'metadata.name: Invalid value: "{name}": should match: a DNS-1035 label '
                     "must consist of lower case alphanumeric characters or '-', start with an "
                     "alphabetic character, and end with an alphanumeric character (e.g. "
                     "'my-name',  or 'abc-123', regex used for validation is "
                     "'[a-z]([-a-z0-9]*[a-z0-9])?')")
    specs = (job.get("spec") or {}).get("pytorchReplicaSpecs")
    if specs is None:
        found.append("spec.pytorchReplicaSpecs: Required value: must be required")
    for rtype, replica in sorted((specs or {}).items()):
        path = f"spec.pytorchReplicaSpecs[{rtype}]"
        containers = (((replica or {}).get("template") or {}).get("spec") or {}).get(
            "containers") or []
        if rtype not in TYPES:
            found.append(f'{path}: Unsupported value: "{rtype}": supported values: "Master", '
                         '"Worker"')
        if not containers:
            found.append(f"{path}.template.spec.containers: Required value: must be specified")
        for i, container in enumerate(containers):
            if not container.get("image"):
                found.append(f"{path}.template.spec.containers[{i}].image: Required value: "
                             "must be required")
        if not any(c.get("name") == CONTAINER for c in containers):
            found.append(f"{path}.template.spec.containers: Required value: must have at least "
                         f"one container with name {CONTAINER}")
        replicas = (replica or {}).get("replicas")
        if rtype == "Master" and replicas != 1:
            found.append(f"{path}.replicas: Forbidden: must be 1")
        elif rtype != "Master" and replicas is not None and int(replicas) < 1:
            found.append(f"{path}.replicas: Forbidden: must be at least 1")
    return found


def validate(job: dict[str, Any]) -> None:
    """The operator's validating webhook: a refusal is a 403 naming the webhook."""
    found = _errors(job)
    if found:
        text = found[0] if len(found) == 1 else "[" + ", ".join(found) + "]"
        raise Forbidden(f'admission webhook "{WEBHOOK}" denied the request: {text}')


def replica_name(job_name: str, rtype: str, index: int) -> str:
    """GenGeneralName: `<job>-<type in lower case>-<index>` (pods and Services alike)."""
    return f"{job_name}-{rtype.lower()}-{index}".replace("/", "-")


def labels(job_name: str, rtype: str | None = None, index: int | None = None) -> dict[str, str]:
    """GenLabels, plus the replica's type and index when given."""
    found = {f"{LABEL}operator-name": OPERATOR, f"{LABEL}job-name": job_name.replace("/", "-")}
    if rtype is not None:
        found[f"{LABEL}replica-type"] = rtype.lower()
    if index is not None:
        found[f"{LABEL}replica-index"] = str(index)
    return found


def owner(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def _master_port(job: dict[str, Any]) -> int | None:
    master = job["spec"]["pytorchReplicaSpecs"].get("Master") or {}
    for container in master.get("template", {}).get("spec", {}).get("containers") or []:
        if container.get("name") == CONTAINER:
            for port in container.get("ports") or []:
                if port.get("name") == PORT_NAME:
                    return int(port["containerPort"])
    return None


def _env(job: dict[str, Any], rtype: str, index: int) -> list[dict[str, str]]:
    """setPodEnv: the variables appended to every container, in the operator's order."""
    spec = job["spec"]
    specs = spec["pytorchReplicaSpecs"]
    total = sum(int(r.get("replicas", 1)) for r in specs.values())
    nproc = str(spec.get("nprocPerNode") or "")
    world = total * (int(nproc) if nproc.isdigit() else 1)
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if "Master" in specs:
        port, addr = str(_master_port(job)), replica_name(job["metadata"]["name"], "Master", 0)
        rank = str(index + (1 if rtype == "Worker" else 0))
        env += [{"name": "MASTER_PORT", "value": port}, {"name": "PET_MASTER_PORT", "value": port},
                {"name": "MASTER_ADDR", "value": addr}, {"name": "PET_MASTER_ADDR", "value": addr},
                {"name": "WORLD_SIZE", "value": str(world)}, {"name": "RANK", "value": rank},
                {"name": "PET_NODE_RANK", "value": rank}]
    if spec.get("nprocPerNode") is not None:
        env.append({"name": "PET_NPROC_PER_NODE", "value": nproc})
    env.append({"name": "PET_NNODES", "value": str(total)})
    return env


def pod(job: dict[str, Any], rtype: str, index: int) -> dict[str, Any]:
    """createNewPod: the replica's pod, named and labelled as the operator does."""
    replica = job["spec"]["pytorchReplicaSpecs"][rtype]
    template = copy.deepcopy(replica.get("template") or {})
    meta = template.get("metadata") or {}
    meta["labels"] = {**(meta.get("labels") or {}), **labels(job["metadata"]["name"], rtype,
                                                             index)}
    if rtype == "Master":
        meta["labels"][f"{LABEL}job-role"] = "master"
    meta.update(name=replica_name(job["metadata"]["name"], rtype, index),
                namespace=job["metadata"]["namespace"], ownerReferences=[owner(job)])
    spec = template.get("spec") or {}
    for container in spec.get("containers") or []:
        container["env"] = [*(container.get("env") or []), *_env(job, rtype, index)]
    policy = replica.get("restartPolicy", "OnFailure")
    spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def service(job: dict[str, Any], rtype: str, index: int) -> dict[str, Any]:
    """CreateNewService: a headless Service selecting exactly that replica's pod."""
    selector = labels(job["metadata"]["name"], rtype, index)
    containers = (job["spec"]["pytorchReplicaSpecs"][rtype].get("template", {}).get("spec", {})
                  .get("containers") or [])
    ports = [{"name": p["name"], "port": int(p["containerPort"])}
             for c in containers if c.get("name") == CONTAINER for p in c.get("ports") or []
             if p.get("name")]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": replica_name(job["metadata"]["name"], rtype, index),
                         "namespace": job["metadata"]["namespace"], "labels": dict(selector),
                         "ownerReferences": [owner(job)]},
            "spec": {"clusterIP": "None", "selector": selector, "ports": ports}}
