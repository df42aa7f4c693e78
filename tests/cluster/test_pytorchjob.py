"""Kubeflow PyTorchJob (kubeflow.org/v1) against the training operator's documented behaviour.

Oracles: kubeflow/training-operator v1.9.0 — the CRD (kubeflow.org_pytorchjobs.yaml: State and
Age printer columns, status subresource), pytorch_defaults.go, the validating webhook,
envvar.go/master.go (MASTER_ADDR is the master's Service `<job>-master-0`, RANK the pod's
index + 1 for workers, WORLD_SIZE, PET_*), common/pod.go and service.go (pod and headless
Service per replica, the operator's labels), UpdateJobStatus/ReconcileJobs (conditions and
reasons `PyTorchJob<Type>`, replicaStatuses, cleanPodPolicy, backoffLimit). The official
client's CustomObjectsApi and kubectl are the clients; containers are real processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import kubectl, read_log
from kubernetes import client
from kubernetes.client.rest import ApiException
from waiting import wait_for

import kubesim

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
LABEL = "training.kubeflow.org/"
# Reports its operator-set env and what MASTER_ADDR resolves to (retrying, like the operator's
# init container), then the master waits for the file named by argv[1].
REPLICA = (
    "import json, os, socket, sys, time\n"
    "keys = ['MASTER_ADDR', 'MASTER_PORT', 'PET_MASTER_ADDR', 'PET_MASTER_PORT', 'WORLD_SIZE',\n"
    "        'RANK', 'PET_NODE_RANK', 'PET_NNODES', 'PET_NPROC_PER_NODE', 'PYTHONUNBUFFERED']\n"
    "end, addr = time.time() + 20, None\n"
    "while addr is None and time.time() < end:\n"
    "    try:\n"
    "        addr = socket.gethostbyname(os.environ['MASTER_ADDR'])\n"
    "    except OSError:\n"
    "        time.sleep(0.05)\n"
    "print(json.dumps({'env': {k: os.environ.get(k) for k in keys}, 'master': addr}), flush=True)\n"
    "if os.environ['RANK'] == '0':\n"
    "    while not os.path.exists(sys.argv[1]) and time.time() < end + 40:\n"
    "        time.sleep(0.05)\n"
    "sys.exit(int(os.environ.get('EXIT_CODE', '0')))\n")


def pytorchjob(name: str, release: Path, workers: int = 1, worker_exit: int = 0,
               restart: str = "Never", **run_policy: Any) -> dict[str, Any]:
    def replica(replicas: int, exit_code: int) -> dict[str, Any]:
        return {"replicas": replicas, "restartPolicy": restart, "template": {"spec": {
            "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "pytorch", "image": "python:3.11",
                "env": [{"name": "EXIT_CODE", "value": str(exit_code)}],
                "command": ["python", "-c", REPLICA, str(release)]}]}}}

    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PyTorchJob",
            "metadata": {"name": name},
            "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": {
                "Master": replica(1, 0), "Worker": replica(workers, worker_exit)}}}


@pytest.fixture
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def read(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    return dict(custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))


def condition(custom: client.CustomObjectsApi, ns: str, name: str,
              ctype: str) -> dict[str, Any] | None:
    conditions = (read(custom, ns, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == ctype and c["status"] == "True"), None)


def reasons(core: client.CoreV1Api, ns: str, name: str) -> list[str]:
    return [e.reason for e in core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}").items]


def test_pytorchjobs_are_discoverable_and_served_to_the_custom_objects_api_and_kubectl(
        sim: kubesim.fixture.Sim, api_client: client.ApiClient,
        custom: client.CustomObjectsApi, ns: str, tmp_path: Path) -> None:
    found = client.ApisApi(api_client).get_api_versions()
    assert "kubeflow.org" in [g.name for g in found.groups]
    resources = client.CustomObjectsApi(api_client).get_api_resources(GROUP, VERSION).resources
    assert {(r.name, r.kind) for r in resources} >= {("pytorchjobs", "PyTorchJob"),
                                                     ("pytorchjobs/status", "PyTorchJob")}
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                           pytorchjob("listed", tmp_path / "go"))
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    assert listed["kind"] == "PyTorchJobList"
    assert [j["metadata"]["name"] for j in listed["items"]] == ["listed"]
    wait_for(lambda: condition(custom, ns, "listed", "Running"), what="Running")
    out = kubectl(sim, "get", "pytorchjobs", "-n", ns).stdout.splitlines()
    assert out[0].split() == ["NAME", "STATE", "AGE"]
    assert out[1].split()[:2] == ["listed", "Running"]
    (tmp_path / "go").touch()


def test_a_new_pytorchjob_gets_the_operators_defaults(custom: client.CustomObjectsApi, ns: str,
                                                      tmp_path: Path) -> None:
    body = pytorchjob("plain", tmp_path / "go")
    for replica in body["spec"]["pytorchReplicaSpecs"].values():
        del replica["restartPolicy"]
    del body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    created = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    spec = created["spec"]
    assert spec["runPolicy"]["cleanPodPolicy"] == "None" and spec["nprocPerNode"] == "auto"
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (1, "OnFailure")
    assert worker["template"]["spec"]["containers"][0]["ports"] == [
        {"name": "pytorchjob-port", "containerPort": 23456}]
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "plain")


def test_the_operators_webhook_refuses_a_master_with_more_than_one_replica(
        custom: client.CustomObjectsApi, ns: str, tmp_path: Path) -> None:
    body = pytorchjob("twomasters", tmp_path / "go")
    body["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    assert refused.value.status == 403
    assert json.loads(refused.value.body)["message"] == (
        'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied the '
        "request: spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1")


def test_a_pytorchjob_runs_its_replicas_with_the_operators_names_env_and_services(
        core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str,
        tmp_path: Path) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                           pytorchjob("ddp", tmp_path / "go", workers=2))
    running = wait_for(lambda: condition(custom, ns, "ddp", "Running"), what="Running")
    assert (running["reason"], running["message"]) == ("PyTorchJobRunning",
                                                       "PyTorchJob ddp is running.")
    master = core.read_namespaced_pod("ddp-master-0", ns)
    assert master.metadata.labels == {
        f"{LABEL}operator-name": "pytorchjob-controller", f"{LABEL}job-name": "ddp",
        f"{LABEL}replica-type": "master", f"{LABEL}replica-index": "0",
        f"{LABEL}job-role": "master"}
    assert master.metadata.owner_references[0].kind == "PyTorchJob"
    svc = core.read_namespaced_service("ddp-master-0", ns)
    assert (svc.spec.cluster_ip, svc.spec.ports[0].port) == ("None", 23456)
    assert svc.spec.selector[f"{LABEL}replica-type"] == "master"
    (tmp_path / "go").touch()
    done = wait_for(lambda: condition(custom, ns, "ddp", "Succeeded"), what="Succeeded")
    assert (done["reason"], done["message"]) == ("PyTorchJobSucceeded",
                                                 "PyTorchJob ddp is successfully completed.")
    for rank, name in enumerate(["ddp-master-0", "ddp-worker-0", "ddp-worker-1"]):
        seen = json.loads(read_log(core, name, ns))
        assert seen["master"] == master.status.pod_ip
        assert seen["env"] == {
            "MASTER_ADDR": "ddp-master-0", "MASTER_PORT": "23456",
            "PET_MASTER_ADDR": "ddp-master-0", "PET_MASTER_PORT": "23456", "WORLD_SIZE": "3",
            "RANK": str(rank), "PET_NODE_RANK": str(rank), "PET_NNODES": "3",
            "PET_NPROC_PER_NODE": "auto", "PYTHONUNBUFFERED": "1"}
    status = read(custom, ns, "ddp")["status"]
    assert [c["type"] for c in status["conditions"]] == ["Created", "Running", "Succeeded"]
    assert status["conditions"][1]["status"] == "False"  # Running ends with the job
    assert status["replicaStatuses"]["Master"]["succeeded"] == 1
    assert status["replicaStatuses"]["Worker"]["selector"] == (
        f"{LABEL}job-name=ddp,{LABEL}operator-name=pytorchjob-controller,"
        f"{LABEL}replica-type=worker")
    assert {"SuccessfulCreatePod", "SuccessfulCreateService"} <= set(reasons(core, ns, "ddp"))


def test_a_failed_never_worker_fails_the_job_and_clean_pod_policy_none_keeps_the_master(
        core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str,
        tmp_path: Path) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                           pytorchjob("broken", tmp_path / "go", worker_exit=1))
    failed = wait_for(lambda: condition(custom, ns, "broken", "Failed"), what="Failed")
    assert (failed["reason"], failed["message"]) == (
        "PyTorchJobFailed", "PyTorchJob broken is failed because 1 Worker replica(s) failed.")
    status = read(custom, ns, "broken")["status"]
    assert status["replicaStatuses"]["Worker"]["failed"] == 1 and status.get("completionTime")
    master = core.read_namespaced_pod("broken-master-0", ns)
    assert master.status.phase == "Running" and "env" in read_log(core, "broken-master-0", ns)
    assert "SuccessfulDeletePod" not in reasons(core, ns, "broken")
    (tmp_path / "go").touch()


def test_in_place_restarts_past_the_backoff_limit_fail_the_job_and_delete_its_pods(
        core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str,
        tmp_path: Path) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, pytorchjob(
        "flaky", tmp_path / "go", worker_exit=1, restart="OnFailure", backoffLimit=0))
    failed = wait_for(lambda: condition(custom, ns, "flaky", "Failed"), what="Failed")
    assert (failed["reason"], failed["message"]) == (
        "PyTorchJobFailed", "Job flaky has failed because it has reached the specified backoff "
        "limit")
    wait_for(lambda: not core.list_namespaced_pod(ns).items, what="its pods deleted")
    assert not core.list_namespaced_service(ns).items


def test_deleting_a_pytorchjob_collects_its_pods_and_services(
        core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str,
        tmp_path: Path) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                           pytorchjob("gone", tmp_path / "go"))
    wait_for(lambda: len(core.list_namespaced_service(ns).items) == 2, what="two Services")
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "gone")
    wait_for(lambda: not core.list_namespaced_pod(ns).items
             and not core.list_namespaced_service(ns).items, what="pods and Services gone")
