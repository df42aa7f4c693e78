"""The attempt flow on the Kubernetes work pool: flow pods made by prefect-kubernetes' own worker.

prefect.yaml's `train-attempt/kubernetes` deployment on the `trainguard-kubernetes` pool (created from
deployments/kubernetes/base-job-template.json), a real `prefect worker start --type kubernetes`
against kubesim, and kubesim running each flow pod's `prefect flow-run execute` as a process. Inside
the flow pod, trainguard's backend block holds no kubeconfig, so it reaches the cluster the way a pod
does: in-cluster config (KUBERNETES_SERVICE_HOST/PORT over HTTPS, the service-account token and CA
kubesim projects into the pod). The GPUs are the only stand-in: kubesim's nodes advertise them.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubesim
import pytest
from kubernetes.client import ApiException
from flow_helpers import PREFECT, ROOT, attempt_dir, read_run, subprocess_env
from kube_helpers import pod_of, tiny
from simfixtures import sim_fixture
from prefect.deployments import run_deployment
from runs import attempt_runs
from services.prefect_server import managed_process
from waiting import wait_for

from blocks import EvidenceFolder, KubernetesJobBackend
from trainguard.core.backends.kubernetes.api import KubeApi

POOL, NAMESPACE = "trainguard-kubernetes", "trainguard"  # the pool prefect.yaml names; the template's namespace


# the flow pod's image, the worker's default, runs on this host's Python like the training image
sim = sim_fixture(images={"prefecthq/prefect:*": kubesim.HostPython(sys.executable)})


@pytest.fixture
def worker(sim: Any, deployed: dict[str, Any], prefect_server: str, tmp_path: Path) -> Iterator[None]:
    """One real Kubernetes worker on prefect.yaml's pool, against kubesim."""
    env = {**subprocess_env(prefect_server), "KUBECONFIG": str(sim.kubeconfig), "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES": NAMESPACE}
    argv = [*PREFECT, "worker", "start", "--pool", POOL, "--type", "kubernetes", "--name", f"kube-{uuid.uuid4().hex[:6]}"]
    with managed_process(argv, tmp_path / "worker.log", env, cwd=tmp_path):
        yield


def _namespace(sim: Any) -> KubeApi:
    api = KubeApi.from_kubeconfig(str(sim.kubeconfig))
    try:
        api.core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as exc:
        if exc.status != 409:  # the module's first test made it
            raise
    return api


def _blocks(tmp_path: Path) -> dict[str, str]:
    suffix = uuid.uuid4().hex[:8]
    KubernetesJobBackend(namespace=NAMESPACE, image="python:3.11", local_root=str(tmp_path / "local"),
                         failed_job_ttl_seconds=600).save(f"in-cluster-{suffix}")  # no kubeconfig: in-cluster
    EvidenceFolder(root=str(tmp_path / "evidence")).save(f"evidence-{suffix}")
    return {"backend_block": f"trainguard-kubernetes-job-backend/in-cluster-{suffix}", "evidence_block": f"evidence-{suffix}"}


def _flow_pod(api: KubeApi, flow_run_id: object) -> str | None:
    for pod in api.list_pods(NAMESPACE, f"prefect.io/flow-run-id={flow_run_id}")["items"]:
        if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp"):
            return str(pod["metadata"]["name"])
    return None




def _lineage_done(run_id: str) -> list[Any] | None:
    runs = attempt_runs(run_id)
    return runs if len(runs) == 2 and all(r.state.is_final() for r in runs) else None


@pytest.mark.timeout(600)  # the session's deployments may be made here first: 3 CLI runs on a loaded machine
def test_flow_pods_create_the_training_job_in_cluster_and_the_next_pod_resumes_from_the_checkpoint(
        sim: Any, worker: None, tmp_path: Path) -> None:
    _namespace(sim)
    blocks = _blocks(tmp_path)
    spec = tiny("k-pool", "--fail-at-step", "25", "--fail-on-attempt", "1", "--checkpoint-every", "10")
    # The flow pods' image holds this checkout here: a run-level job variable, as a custom run sets it;
    # the next attempt must carry it over to its own flow pod.
    env = {"PYTHONUNBUFFERED": "1", "TRAINGUARD_PROJECT_DIR": str(ROOT)}
    first = run_deployment("train-attempt/kubernetes", timeout=0, tags=["trainguard-run:k-pool-1"],
                           job_variables={"env": env}, parameters={
        "spec": spec, "run_id": "k-pool-1", **blocks})

    runs = wait_for(lambda: _lineage_done("k-pool-1"), 300, "both attempts to end")
    assert read_run(first.id).state.is_failed() and "nccl_error" in read_run(first.id).state.message
    second = runs[1]
    assert second.state.is_completed(), second.state
    assert second.job_variables == {"env": env}
    assert second.parameters["attempt"] == 2 and second.parameters["parent_flow_run_id"] == str(first.id)
    assert second.parameters["resume_from"] == "/trainguard/checkpoints/k-pool-1/step-000020.json"
    logs = [p.read_text(errors="replace") for p in attempt_dir(tmp_path / "evidence", "k-pool-1", 2).rglob("*.log")]
    assert any("attempt 2: resumed from step 20" in text for text in logs)

    # Each attempt ran in a flow pod of its own, and that pod created its training Job over the
    # in-cluster endpoint as the pool's service account.
    flow_pods = {p["metadata"]["labels"]["prefect.io/flow-run-id"]: p["spec"]["serviceAccountName"]
                 for p in KubeApi.from_kubeconfig(str(sim.kubeconfig)).list_pods(NAMESPACE)["items"]
                 if "prefect.io/flow-run-id" in p["metadata"].get("labels", {})}
    assert flow_pods == {str(first.id): "trainguard", str(second.id): "trainguard"}
    created = [r for r in sim.requests(verb="create", resource="jobs", namespace=NAMESPACE)
               if r["user"] != "kubesim"]  # the worker creates the flow pods' Jobs from its kubeconfig
    assert [(r["scheme"], r["user"]) for r in created] == [("https", "system:serviceaccount:trainguard:trainguard")] * 2


@pytest.mark.timeout(600)
def test_an_evicted_flow_pod_ends_its_attempt_as_preempted_with_exactly_one_next_attempt_from_the_newest_checkpoint(
        sim: Any, worker: None, tmp_path: Path) -> None:
    """The worker's backoffLimit 0 sets PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR=reschedule in the flow
    pod: an eviction reschedules the same flow run. Whether its engine ended the attempt first or the
    run starts again and settles it, the next attempt is scheduled once, under one idempotency key."""
    api = _namespace(sim)
    spec = tiny("k-pool-evict", "--fail-after-steps", "12", "--failure", "hang", "--fail-on-attempt", "1")
    env = {"PYTHONUNBUFFERED": "1", "TRAINGUARD_PROJECT_DIR": str(ROOT)}
    run = run_deployment("train-attempt/kubernetes", timeout=0, tags=["trainguard-run:k-pool-evict-1"],
                         job_variables={"env": env}, parameters={"spec": spec, "run_id": "k-pool-evict-1", **_blocks(tmp_path)})
    training = wait_for(lambda: pod_of(api, NAMESPACE, "k-pool-evict-1", 1), 240, "attempt 1's training pod")
    wait_for(lambda: b"injecting failure 'hang'" in api.read_pod_log(NAMESPACE, training), 120, "training to hang")
    flow_pod = wait_for(lambda: _flow_pod(api, run.id), 30, "the flow pod")
    flow_job = api.read_pod(NAMESPACE, flow_pod)["metadata"]["ownerReferences"][0]["name"]
    api.core.create_namespaced_pod_eviction(flow_pod, NAMESPACE, {"metadata": {"name": flow_pod, "namespace": NAMESPACE}})

    runs = wait_for(lambda: (rs := attempt_runs("k-pool-evict-1")) and len(rs) >= 2 and all(r.state.is_final() for r in rs) and rs,
                    300, "the evicted attempt and its successor to end")
    lineage = [(r.name, r.parameters.get("attempt"), r.state.name, r.run_count) for r in runs]
    assert len(runs) == 2, lineage  # the successor has ended: any second one was scheduled before it
    lost, done = runs
    assert lost.id == run.id and lost.parameters.get("attempt", 1) == 1 and lost.state.is_failed(), lineage
    assert "preempted" in (lost.state.message or ""), lost.state.message
    assert done.parameters["attempt"] == 2 and done.parameters["parent_flow_run_id"] == str(run.id), lineage
    assert done.state.is_completed(), lineage
    assert done.parameters["resume_from"] == "/trainguard/checkpoints/k-pool-evict-1/step-000010.json"
    assert [h["category"] for h in done.parameters["history"]] == ["preempted"]
    # podReplacementPolicy: Failed, so the evicted pod's Job made no second pod running the same flow
    # run beside the worker's new one while the first still stopped (Kubernetes' default would)
    created = api.list_events(NAMESPACE, field_selector=f"involvedObject.kind=Job,involvedObject.name={flow_job}")
    assert [e["reason"] for e in created["items"]].count("SuccessfulCreate") == 1

    evidence = tmp_path / "evidence"
    assert '"category": "preempted"' in (attempt_dir(evidence, "k-pool-evict-1", 1) / "verdict.json").read_text()
    logs = [p.read_bytes() for p in attempt_dir(evidence, "k-pool-evict-1", 1).rglob("*.log")]
    assert any(b"injecting failure 'hang'" in text for text in logs), "the evicted attempt's evidence was kept"
    logs = [p.read_text(errors="replace") for p in attempt_dir(evidence, "k-pool-evict-1", 2).rglob("*.log")]
    assert any("attempt 2: resumed from step 10" in text for text in logs)
    assert pod_of(api, NAMESPACE, "k-pool-evict-1", 1) is None, "attempt 1's hanging training was stopped"
