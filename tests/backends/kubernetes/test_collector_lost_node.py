"""A lost node's hostPath files: the collector pod that would read them is bound to that node.

A pod bound to a crashed node never starts, so a collector that waited for it would wait out its
whole start timeout before the attempt could be judged. Once the node is NotReady (or gone), the
collector gives up at once and says in one line why those files are absent; everything else the
collection reads from the API is still kept. This module crashes a node, so it runs its own kubesim.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from evidence_helpers import Kept, collectors, pods_of, trainguard_job

import kubesim.fixture
from simfixtures import sim_fixture
from trainguard.core.backends.kubernetes import collector
from trainguard.core.backends.kubernetes.api import KubeApi, RetrySettings
from trainguard.core.backends.kubernetes.evidence import collect_kubernetes_evidence
from trainguard.core.stores.folder import LocalEvidenceStore
from waiting import wait_for

sim = sim_fixture(scope="module")
_STEADY = "import time\nprint('step 1 loss 2.0', flush=True)\ntime.sleep(120)\n"
_WAIT = 600  # the collector's start timeout: far longer than the test may take, so only giving up early passes


@pytest.fixture(scope="module")
def kube(sim: kubesim.fixture.Sim) -> Iterator[KubeApi]:
    api = KubeApi.from_kubeconfig(str(sim.kubeconfig), retry=RetrySettings(first_delay_seconds=0.01))
    yield api
    api.close()


def _ready(kube: KubeApi, node: str) -> str:
    conditions = kube.read_node(node).get("status", {}).get("conditions") or []
    return str(next(c["status"] for c in conditions if c["type"] == "Ready"))


@pytest.fixture
def crashed(sim: kubesim.fixture.Sim, kube: KubeApi) -> Iterator[Any]:
    """Crash a node (`crashed(name)`); it is healed and Ready again after the test."""
    down: list[str] = []

    def crash(node: str) -> None:
        sim.node(node).crash()
        down.append(node)

    yield crash
    for node in down:
        sim.node(node).heal()
        wait_for(lambda node=node: _ready(kube, node) == "True", timeout=60, what=f"{node} Ready again")


def _running_pod(kube: KubeApi, ns: str, job: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        return next((p for p in pods_of(kube, ns, job) if (p.get("status") or {}).get("phase") == "Running"), None)
    return wait_for(running, timeout=60, what="the training pod running")


def test_files_on_a_notready_node_are_recorded_absent_at_once_and_the_rest_is_kept(
    kube: KubeApi, ns: str, tmp_path: Path, crashed: Any,
) -> None:
    job = trainguard_job(kube, ns, _STEADY, attempt_volume="hostPath")
    pod = _running_pod(kube, ns, job)
    node = pod["spec"]["nodeName"]
    crashed(node)
    wait_for(lambda: _ready(kube, node) != "True", timeout=60, what=f"{node} NotReady")

    store = LocalEvidenceStore(tmp_path / "evidence")
    manifest = collect_kubernetes_evidence(kube, ns, job, "run-1", 1, store, kept_dir=tmp_path / "triage",
                                           collector_timeout_seconds=_WAIT)
    kept = Kept(store, manifest)

    why = kept.why("volume")
    assert f"node {node} is NotReady (Ready=Unknown, NodeStatusUnknown" in why, why
    assert "all other evidence was kept" in why and "\n" not in why
    assert "kubernetes/job.json" in kept.items and f"kubernetes/pods/{pod['metadata']['name']}.json" in kept.items
    assert not collectors(kube, ns)  # none was started for a node that cannot run it


def test_a_collector_waiting_on_the_node_it_is_bound_to_gives_up_once_that_node_is_notready(
    kube: KubeApi, ns: str, tmp_path: Path, crashed: Any,
) -> None:
    job = trainguard_job(kube, ns, _STEADY, attempt_volume="hostPath")
    pod = _running_pod(kube, ns, job)
    node = pod["spec"]["nodeName"]
    crashed(node)  # its kubelet is gone, but the node is Ready until its heartbeats are missed
    template = kube.read_job(ns, job)["spec"]["template"]["spec"]
    body = collector.pod_manifest({"metadata": {"name": job}, "spec": {"template": {"spec": template}}},
                                  collector.plan(template), node=node, budget_bytes=1024)
    name = kube.create_pod(ns, body)["metadata"]["name"]

    with pytest.raises(collector.NodeUnavailable, match=f"node {node} is NotReady"):
        collector.wait_started(kube, ns, name, _WAIT)  # the node it waits on is the one the pod is bound to
    assert _ready(kube, node) != "True"
    assert (kube.read_pod(ns, name).get("status") or {}).get("phase") == "Pending"  # it could never have started
    kube.delete_pod(ns, name, grace_seconds=0)


def test_a_node_that_is_gone_is_said_to_be_gone(kube: KubeApi) -> None:
    assert collector.node_unavailable(kube, "no-such-node") == "node no-such-node is gone (no longer in the cluster)"
    assert collector.node_unavailable(kube, "gpu-node-1") is None
