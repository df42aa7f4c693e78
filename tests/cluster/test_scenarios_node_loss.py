"""A node that is deleted for good: pod GC fails and removes what was bound to it.

A cluster of its own, since losing a node would change what the shared one can schedule.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import kubesim
import pytest
from kubernetes import client, config
from test_scenarios_disruptions import condition, last_state_before_deletion, pod, running
from test_scenarios_jobs import pod_log
from waiting import wait_for


@pytest.fixture(scope="module")
def lossy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubesim.fixture.Sim]:
    with kubesim.run(root=tmp_path_factory.mktemp("lossy"),
                     nodes=[kubesim.Node("node-a"), kubesim.Node("node-b")],
                     images={"python:*": kubesim.HostPython(sys.executable)},
                     time_scale=0.02) as sim:
        yield sim


def test_an_out_of_service_taint_lets_pod_gc_force_delete_pods_stuck_terminating(
        lossy: kubesim.fixture.Sim) -> None:
    core = client.CoreV1Api(config.new_client_from_config(str(lossy.kubeconfig)))
    code = "import os, time\nprint('up', os.getpid(), flush=True)\ntime.sleep(120)"
    spec = pod("stuck", code)
    spec["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-b"}
    core.create_namespaced_pod("default", spec)
    witness = pod("witness", code)
    witness["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-a"}
    core.create_namespaced_pod("default", witness)
    running(core, "default", "stuck")
    running(core, "default", "witness")
    pid = int(pod_log(core, "default", "stuck").split()[1])
    lossy.node("node-b").partition()
    try:
        wait_for(lambda: condition(core.read_node("node-b"), "Ready").status == "Unknown",
                 what="node-b NotReady")
        core.delete_namespaced_pod("stuck", "default")
        core.delete_namespaced_pod("witness", "default")
        # The moment a kubelet would have finished the deletion: node-a's has finished the witness's.
        wait_for(lambda: not any(p.metadata.name == "witness" for p in core.list_namespaced_pod("default").items),
                 what="the witness pod on a healthy node to be gone")
        # no kubelet to finish the deletion: the pod stays Terminating
        seen = core.read_namespaced_pod("stuck", "default")
        assert seen.metadata.deletion_timestamp
        taints = core.read_node("node-b").spec.taints + [client.V1Taint(
            key="node.kubernetes.io/out-of-service", value="nodeshutdown", effect="NoExecute")]
        core.patch_node("node-b", {"spec": {"taints": [t.to_dict() for t in taints]}})
        last = last_state_before_deletion(core, "default", seen)
        assert last.status.phase == "Failed" and condition(last, "DisruptionTarget") is None
        assert os.path.exists(f"/proc/{pid}"), "the cut-off node's container should run on"
    finally:
        core.patch_node("node-b", {"spec": {"taints": None}})
        lossy.node("node-b").heal()
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or None,
             what="the container to stop once its node learns the pod is gone")
    wait_for(lambda: condition(core.read_node("node-b"), "Ready").status == "True",
             what="node-b Ready again")


def test_deleting_a_node_lets_pod_gc_fail_and_remove_its_pods(
        lossy: kubesim.fixture.Sim) -> None:
    core = client.CoreV1Api(config.new_client_from_config(str(lossy.kubeconfig)))
    spec = pod("orphaned")
    spec["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-b"}
    core.create_namespaced_pod("default", spec)
    seen = running(core, "default", "orphaned")
    leases = client.CoordinationV1Api(core.api_client)
    node_b = core.read_node("node-b")
    owners = wait_for(lambda: _lease_owners(leases, "node-b"), what="node-b's Lease")
    assert [(o.kind, o.name, o.uid) for o in owners] == [("Node", "node-b", node_b.metadata.uid)]
    lossy.node("node-b").delete()
    last = last_state_before_deletion(core, "default", seen)
    target = condition(last, "DisruptionTarget")
    assert (target.reason, target.message) == ("DeletionByPodGC", "PodGC: node no longer exists")
    assert last.status.phase == "Failed"
    assert [n.metadata.name for n in core.list_node().items] == ["node-a"]
    # The garbage collector removes the Lease its Node owned.
    wait_for(lambda: [lease.metadata.name for lease in leases.list_namespaced_lease(
        "kube-node-lease").items] == ["node-a"] or None, what="node-b's Lease collected")
    replacement = pod("elsewhere", "print('fine')")
    core.create_namespaced_pod("default", replacement)
    wait_for(lambda: core.read_namespaced_pod("elsewhere", "default").status.phase
             == "Succeeded" or None, what="a pod on the remaining node")


def _lease_owners(leases: client.CoordinationV1Api, node: str) -> Any:
    found = leases.list_namespaced_lease("kube-node-lease").items
    return next((lease.metadata.owner_references for lease in found
                 if lease.metadata.name == node), None)
