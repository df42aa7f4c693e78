"""Node objects and the node lifecycle: heartbeats, NotReady, taint eviction, pod GC.

What belongs here: creating the Node objects from the configuration, each kubelet's
heartbeat, the node lifecycle controller (missed heartbeats -> conditions Unknown and the
unreachable taints), the taint manager (NoExecute taints evict pods after their
tolerationSeconds) and pod GC (pods on a node that no longer exists fail and go). Texts
follow pkg/controller/nodelifecycle, tainteviction and podgc of Kubernetes 1.32.

What does not: running pods (kubelet.py) or placing them (scheduler.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from datetime import datetime, timezone
from typing import Any

from kubesim.config import NodeSpec, SimConfig
from kubesim.kubelet import Kubelet
from kubesim.scheduler import tolerates
from kubesim.store import AlreadyExists, Store, timestamp

HEARTBEAT_SECONDS = 10.0
MONITOR_GRACE_SECONDS = 40.0
# Floor of the scaled grace: a loaded 2-core machine can stall the loop for a second, and a
# node flapping NotReady would be a fault nobody asked for.
MIN_GRACE_SECONDS = 2.0
POD_GC_SECONDS = 2.0
UNREACHABLE = "node.kubernetes.io/unreachable"
LEASE_NAMESPACE = "kube-node-lease"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
_CONDITIONS = (("MemoryPressure", "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available"),
               ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
               ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))


def node_object(spec: NodeSpec, index: int) -> dict[str, Any]:
    """The Node a kubelet registers for itself."""
    now = timestamp()
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110",
                "ephemeral-storage": "100Gi"}
    if spec.gpus:
        capacity["nvidia.com/gpu"] = str(spec.gpus)
    conds = [{"type": t, "status": "False", "reason": r, "message": m,
              "lastHeartbeatTime": now, "lastTransitionTime": now} for t, r, m in _CONDITIONS]
    conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                  "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                  "lastTransitionTime": now})
    labels = {"kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
              "beta.kubernetes.io/arch": "amd64", **spec.labels}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {"podCIDR": f"10.244.{index}.0/24", "podCIDRs": [f"10.244.{index}.0/24"],
                 **({"taints": [dict(t) for t in spec.taints]} if spec.taints else {})},
        "status": {
            "capacity": capacity, "allocatable": dict(capacity), "conditions": conds,
            "addresses": [{"type": "InternalIP", "address": f"10.0.0.{index + 10}"},
                          {"type": "Hostname", "address": spec.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"kubesim{index:024d}", "systemUUID": f"kubesim-{index}",
                         "bootID": f"kubesim-boot-{index}", "kernelVersion": "6.1.0-kubesim",
                         "osImage": "kubesim", "containerRuntimeVersion": "kubesim://0",
                         "kubeletVersion": "v1.32.4-kubesim",
                         "kubeProxyVersion": "v1.32.4-kubesim", "operatingSystem": "linux",
                         "architecture": "amd64"},
        },
    }


def _seconds_since(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    return time.time() - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class NodeLifecycle:
    """Heartbeats for connected kubelets; NotReady, taints, eviction and GC for the rest."""

    def __init__(self, store: Store, config: SimConfig, kubelets: dict[str, Kubelet]) -> None:
        self.store, self.config, self.kubelets = store, config, kubelets
        now = time.monotonic()
        self._last_beat = {name: now for name in kubelets}
        self._last_renew: dict[str, float] = {}
        self._known_nodes: set[str] = set()
        self._gc_at = 0.0

    def scaled(self, seconds: float) -> float:
        return seconds * self.config.time_scale

    @property
    def grace(self) -> float:
        return max(self.scaled(MONITOR_GRACE_SECONDS), MIN_GRACE_SECONDS)

    async def run(self) -> None:
        period = max(self.scaled(HEARTBEAT_SECONDS), 0.05)
        while True:
            for name, kubelet in self.kubelets.items():
                if kubelet.connected:
                    self.heartbeat(name)
            self.monitor()
            self.evict_tainted()
            names = {n["metadata"]["name"] for n in self.store.list("nodes")}
            # Pod GC at once when a node went away, else now and then (it copies every pod).
            if names != self._known_nodes or time.monotonic() - self._gc_at > POD_GC_SECONDS:
                self._known_nodes, self._gc_at = names, time.monotonic()
                self.collect_orphans()
            await asyncio.sleep(min(period, self.grace / 4))

    def renew_lease(self, name: str) -> None:
        """The kubelet's Lease in kube-node-lease (what `kubectl describe node` shows)."""
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # MicroTime
        if self.store.mutate("leases", LEASE_NAMESPACE, name,
                             lambda lease: lease["spec"].update(renewTime=now)) is not None:
            return
        node = self.store.get("nodes", None, name)
        if node is None:
            return
        # As the kubelet's lease controller sets it: the garbage collector removes the Lease
        # once its Node is deleted.
        owner = {"apiVersion": "v1", "kind": "Node", "name": name,
                 "uid": node["metadata"]["uid"]}
        with contextlib.suppress(AlreadyExists):
            self.store.create("leases", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE,
                             "ownerReferences": [owner]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                         "renewTime": now}})

    def heartbeat(self, name: str) -> None:
        self._last_beat[name] = time.monotonic()
        if time.monotonic() - self._last_renew.get(name, 0.0) >= max(
                self.scaled(HEARTBEAT_SECONDS), 1.0):
            self._last_renew[name] = time.monotonic()
            self.renew_lease(name)
        now = timestamp()

        def beat(node: dict[str, Any]) -> None:
            for cond in node["status"]["conditions"]:
                cond["lastHeartbeatTime"] = now
                if cond["status"] == "Unknown":  # the kubelet is back: it reports afresh
                    healthy = node_object(self._spec(name), 0)["status"]["conditions"]
                    fresh = next(c for c in healthy if c["type"] == cond["type"])
                    cond.update(fresh, lastHeartbeatTime=now, lastTransitionTime=now)
            taints = [t for t in node["spec"].get("taints") or [] if t["key"] != UNREACHABLE]
            node["spec"]["taints"] = taints
            if not taints:
                node["spec"].pop("taints")

        self.store.mutate("nodes", None, name, beat)

    def _spec(self, name: str) -> NodeSpec:
        return next(n for n in self.config.nodes if n.name == name)

    def monitor(self) -> None:
        """Nodes whose kubelet stopped posting: conditions Unknown and unreachable taints."""
        for node in self.store.list("nodes"):
            ready = next((c for c in node["status"].get("conditions") or []
                          if c["type"] == "Ready"), None)
            name = node["metadata"]["name"]
            if ready is None or ready["status"] == "Unknown":
                continue
            last = self._last_beat.get(name, time.monotonic())
            if time.monotonic() - last < self.grace:
                continue
            self._mark_unknown(name)

    def _mark_unknown(self, name: str) -> None:
        now = timestamp()

        def unknown(node: dict[str, Any]) -> None:
            for cond in node["status"]["conditions"]:
                cond.update(status="Unknown", reason="NodeStatusUnknown",
                            message="Kubelet stopped posting node status.",
                            lastTransitionTime=now)
            taints = node["spec"].setdefault("taints", [])
            for effect in ("NoSchedule", "NoExecute"):
                taint = {"key": UNREACHABLE, "effect": effect, "timeAdded": now}
                if not any(t["key"] == UNREACHABLE and t["effect"] == effect for t in taints):
                    taints.append(taint if effect == "NoExecute" else
                                  {"key": UNREACHABLE, "effect": effect})

        node = self.store.mutate("nodes", None, name, unknown)
        if node is None:
            return
        self.store.record_event(node, "NodeNotReady",
                                f"Node {name} status is now: NodeNotReady",
                                component="node-controller")
        for pod in self.store.list("pods", field_selector=f"spec.nodeName={name}"):
            self.store.record_event({"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]},
                                    "NodeNotReady", "Node is not ready", type="Warning",
                                    component="node-controller")
            self.store.mutate("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                              _pod_not_ready)

    def evict_tainted(self) -> None:
        """The taint manager: pods not tolerating a NoExecute taint (long enough) go."""
        for node in self.store.list("nodes"):
            taints = [t for t in (node["spec"].get("taints") or []) if t["effect"] == "NoExecute"]
            if not taints:
                continue
            for pod in self.store.list("pods", field_selector=f"spec.nodeName={node['metadata']['name']}"):
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                if any(self._must_go(pod, t) for t in taints):
                    self._taint_evict(pod)

    def _must_go(self, pod: dict[str, Any], taint: dict[str, Any]) -> bool:
        if not tolerates(pod, taint):
            return True
        for tol in pod["spec"].get("tolerations") or []:
            if tol.get("key") in (taint["key"], None) and tol.get("tolerationSeconds") is not None:
                return _seconds_since(taint.get("timeAdded")) >= self.scaled(tol["tolerationSeconds"])
        return False

    def _taint_evict(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.store.record_event({"apiVersion": "v1", "kind": "Pod", "metadata": meta},
                                "TaintManagerEviction",
                                f"Marking for deletion Pod {meta['namespace']}/{meta['name']}",
                                component="taint-eviction-controller")
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        self.store.mutate("pods", meta["namespace"], meta["name"], lambda p: _disrupt(
            p, "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint", grace))

    def collect_orphans(self) -> None:
        """Pod GC (pkg/controller/podgc): pods bound to a node that no longer exists, and
        terminating pods on a NotReady node tainted out-of-service, fail and are force-deleted."""
        nodes = {n["metadata"]["name"]: n for n in self.store.list("nodes")}
        out_of_service = {name for name, n in nodes.items() if not _ready(n) and any(
            t["key"] == OUT_OF_SERVICE for t in n["spec"].get("taints") or [])}
        for pod in self.store.list("pods"):
            meta, node = pod["metadata"], pod["spec"].get("nodeName")
            if not node or meta.get("deletionGracePeriodSeconds") == 0:
                continue
            if node not in nodes:
                condition = ("DeletionByPodGC", "PodGC: node no longer exists")
            elif node in out_of_service and meta.get("deletionTimestamp"):
                condition = None
            else:
                continue
            self.store.mutate("pods", meta["namespace"], meta["name"],
                              functools.partial(_fail_and_force_delete, condition=condition))


def _ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node["status"].get("conditions") or [])


def _fail_and_force_delete(pod: dict[str, Any], condition: tuple[str, str] | None) -> None:
    """markFailedAndDeletePodWithCondition: the condition only for a pod not yet terminal."""
    status = pod.setdefault("status", {})
    if status.get("phase") not in ("Succeeded", "Failed"):
        status["phase"] = "Failed"
        if condition is not None:
            _disrupt(pod, *condition, 0)
    pod["metadata"].setdefault("deletionTimestamp", timestamp())
    pod["metadata"]["deletionGracePeriodSeconds"] = 0


def _pod_not_ready(pod: dict[str, Any]) -> None:
    now = timestamp()
    for cond in pod.setdefault("status", {}).get("conditions") or []:
        if cond["type"] in ("Ready", "ContainersReady") and cond["status"] != "False":
            cond.update(status="False", lastTransitionTime=now)
            if cond["type"] == "Ready":
                cond["reason"] = "NodeNotReady"  # kubelet/status: no message for NodeNotReady


def _disrupt(pod: dict[str, Any], reason: str, message: str, grace: int) -> None:
    conds = pod.setdefault("status", {}).setdefault("conditions", [])
    conds[:] = [c for c in conds if c["type"] != "DisruptionTarget"] + [{
        "type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
        "lastProbeTime": None, "lastTransitionTime": timestamp()}]
    pod["metadata"].setdefault("deletionTimestamp", timestamp())
    pod["metadata"]["deletionGracePeriodSeconds"] = grace
