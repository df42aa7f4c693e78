"""Every pod gets a scheduling decision, however busy the API is when it is created.

The oracle is the kube-scheduler's contract: a pod naming the default scheduler is either bound
to a node (`spec.nodeName`, a `Scheduled` event) or marked `PodScheduled=False
reason=Unschedulable` with a `FailedScheduling` event, in the scheduler's words, at once; a pod
naming a scheduler that does not exist gets neither and stays Pending.

The scheduler coalesces a burst of store changes into one pass; the pods a Job controller creates
when a suspended Job resumes land in the same burst as the Job's own writes and its events, and as
whatever else clients write meanwhile (Secrets, Services, events, other Jobs). So the Jobs here are
resumed while a second thread keeps writing such objects, many times over.

This module runs its own cluster at real speed (time_scale 1): the nodes' heartbeats then come
every 10 s, as a kubelet's do, and cannot hide a pass that was missed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

import kubesim
import kubesim.fixture
from simfixtures import HOST_PYTHON
from waiting import wait_for

IMAGE = "python:3.11"
ROUNDS = 12
NO_FIT = ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
          "available: 2 No preemption victims found for incoming pod.")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubesim.fixture.Sim]:
    nodes = [kubesim.Node("node-1", gpus=2, cpu="8", memory="16Gi"),
             kubesim.Node("node-2", cpu="8", memory="16Gi")]
    with kubesim.run(root=tmp_path_factory.mktemp("bursts"), nodes=nodes, images=HOST_PYTHON,
                     time_scale=1.0) as running:
        yield running


@pytest.fixture(scope="module")
def apis(cluster: kubesim.fixture.Sim) -> tuple[client.CoreV1Api, client.BatchV1Api]:
    api = config.new_client_from_config(str(cluster.kubeconfig))
    return client.CoreV1Api(api), client.BatchV1Api(api)


def indexed_job(name: str, pods: int, resources: dict[str, Any], code: str = "pass") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completionMode": "Indexed", "completions": pods, "parallelism": pods,
                     "suspend": True, "backoffLimit": 0, "template": {"spec": {
                         "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "train", "image": IMAGE, "resources": resources,
                                         "command": ["python", "-c", code]}]}}}}


class Writer:
    """A second client writing Secrets, Services, events and suspended Jobs until stopped."""

    def __init__(self, cluster: kubesim.fixture.Sim, ns: str) -> None:
        api = config.new_client_from_config(str(cluster.kubeconfig))
        self.core, self.batch, self.ns = client.CoreV1Api(api), client.BatchV1Api(api), ns
        self.stop = threading.Event()
        self.writes = 0
        self.thread = threading.Thread(target=self._run, daemon=True, name="burst-writer")

    def __enter__(self) -> Writer:
        self.thread.start()
        wait_for(lambda: self.writes >= 4, what="the writer's first writes")
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        while not self.stop.is_set():
            tag = uuid.uuid4().hex[:8]
            meta = {"name": f"noise-{tag}"}
            self.core.create_namespaced_secret(self.ns, {"metadata": meta, "stringData": {"k": tag}})
            self.core.create_namespaced_service(self.ns, {"metadata": meta, "spec": {
                "clusterIP": "None", "selector": {"app": tag}}})
            self.core.create_namespaced_event(self.ns, {
                "metadata": meta, "reason": "Noise", "message": tag, "type": "Normal",
                "involvedObject": {"kind": "Secret", "name": meta["name"], "namespace": self.ns}})
            self.batch.create_namespaced_job(self.ns, indexed_job(meta["name"], 1, {}))
            self.writes += 4


def decision(core: client.CoreV1Api, ns: str, pod: client.V1Pod) -> str | None:
    """"bound", or the FailedScheduling message once the pod has both the event and the condition."""
    fresh = core.read_namespaced_pod(pod.metadata.name, ns)
    if fresh.spec.node_name:
        return "bound"
    scheduled = next((c for c in fresh.status.conditions or [] if c.type == "PodScheduled"), None)
    if scheduled is None or (scheduled.status, scheduled.reason) != ("False", "Unschedulable"):
        return None
    said = {e.message for e in core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={pod.metadata.name},reason=FailedScheduling").items}
    return scheduled.message if scheduled.message in said else None


def decisions(core: client.CoreV1Api, ns: str, job: str, count: int) -> dict[str, str] | None:
    pods = core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items
    if len(pods) < count:
        return None
    found = {p.metadata.name: decision(core, ns, p) for p in pods}
    return found if all(found.values()) else None


def resume(batch: client.BatchV1Api, ns: str, name: str) -> None:
    batch.patch_namespaced_job(name, ns, {"spec": {"suspend": False}})


def test_every_pod_of_a_resumed_job_is_bound_or_refused_amid_a_burst_of_writes(
        cluster: kubesim.fixture.Sim, apis: tuple[client.CoreV1Api, client.BatchV1Api]) -> None:
    core, batch = apis
    for round_ in range(ROUNDS):
        ns = f"burst-{round_}-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        batch.create_namespaced_job(ns, indexed_job("fits", 3, {"requests": {"cpu": "100m"}}))
        batch.create_namespaced_job(ns, indexed_job("too-big", 2, {"limits": {"nvidia.com/gpu": "8"}}))
        with Writer(cluster, ns):
            resume(batch, ns, "fits")
            resume(batch, ns, "too-big")
            bound = wait_for(lambda: decisions(core, ns, "fits", 3), timeout=15,
                             what=lambda: f"round {round_}: a decision on every pod of fits: "
                                          f"{decisions_now(core, ns, 'fits')}")
            refused = wait_for(lambda: decisions(core, ns, "too-big", 2), timeout=15,
                               what=lambda: f"round {round_}: a decision on every pod of too-big: "
                                            f"{decisions_now(core, ns, 'too-big')}")
        assert set(bound.values()) == {"bound"}
        assert set(refused.values()) == {NO_FIT}
        # the pods that ran end before the next round, so none of their changes helps it along
        wait_for(lambda: any(c.type == "Complete" and c.status == "True" for c in
                             batch.read_namespaced_job_status("fits", ns).status.conditions or []),
                 timeout=60, what=f"round {round_}: fits complete")
        batch.delete_namespaced_job("too-big", ns, propagation_policy="Background")
        wait_for(lambda: not core.list_namespaced_pod(ns, label_selector="job-name=too-big").items,
                 what=f"round {round_}: too-big's pods gone")


def decisions_now(core: client.CoreV1Api, ns: str, job: str) -> dict[str, str | None]:
    return {p.metadata.name: decision(core, ns, p)
            for p in core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items}


def test_a_pod_naming_a_scheduler_that_does_not_exist_stays_pending_with_no_decision(
        apis: tuple[client.CoreV1Api, client.BatchV1Api]) -> None:
    core, _ = apis
    ns = f"sched-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})

    def pod(name: str, **spec: Any) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {
            "restartPolicy": "Never", **spec, "containers": [{
                "name": "train", "image": IMAGE, "command": ["python", "-c", "pass"],
                "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}

    core.create_namespaced_pod(ns, pod("elsewhere", schedulerName="gpu-batch-scheduler"))
    core.create_namespaced_pod(ns, pod("here"))
    # the default scheduler's pass over the pods pending after both were created has run
    assert wait_for(lambda: decision(core, ns, core.read_namespaced_pod("here", ns))) == NO_FIT
    core.create_namespaced_pod(ns, pod("later"))  # and another pass after that one
    wait_for(lambda: decision(core, ns, core.read_namespaced_pod("later", ns)))
    elsewhere = core.read_namespaced_pod("elsewhere", ns)
    assert elsewhere.spec.node_name is None and elsewhere.status.phase == "Pending"
    assert not elsewhere.status.conditions
    assert not core.list_namespaced_event(ns, field_selector="involvedObject.name=elsewhere").items
