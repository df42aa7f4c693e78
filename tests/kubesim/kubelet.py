"""The kubelet of one simulated node: which pods are its own, and node-wide container duties.

What belongs here: the per-node sync loop (pods bound to this node get a pod worker; deleted
pods lose their files), the kubelet's events, IP and GPU allocation, and killing everything
on a node crash. Pod IPs come from the cluster-wide pool (network.py). Messages follow pkg/kubelet of Kubernetes 1.32.

What does not: one pod's lifecycle (podworker.py), its reported status (podstatus.py),
processes (runtime.py), heartbeats and node conditions (nodes.py).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from typing import Any

from kubesim import runtime
from kubesim.config import NodeSpec, SimConfig
from kubesim.dns import ClusterDns
from kubesim.network import PodIps
from kubesim.podworker import PodWorker, finalize_deletion, involved, pod_dir
from kubesim.store import Store

MIN_TERMINATION_GRACE_SECONDS = 0.5

log = logging.getLogger("kubesim.kubelet")

__all__ = ["Kubelet", "PodWorker"]


class Kubelet:
    """Runs the pods bound to one node."""

    def __init__(self, store: Store, node: NodeSpec, config: SimConfig,
                 memory: runtime.MemoryControl, index: int, *, ips: PodIps,
                 dns: ClusterDns) -> None:
        self.store, self.node, self.config, self.memory = store, node, config, memory
        self.ips, self.dns = ips, dns  # shared by every node: pod IPs are cluster-wide
        self.name = node.name
        self.index = index
        self.connected = True  # False while partitioned: status writes are lost
        self.api_url = ""  # set by the server once it listens
        self.workers: dict[str, PodWorker] = {}
        self.reaping: set[asyncio.Future[runtime.Exit]] = set()
        self.missed_deletions: list[dict[str, Any]] = []

    def scaled(self, seconds: float) -> float:
        return seconds * self.config.time_scale

    def termination_grace(self, seconds: float) -> float:
        """A pod's grace period, scaled, but never under MIN_TERMINATION_GRACE_SECONDS unless it is 0.

        Scaling 1 s to 20 ms leaves a process no time to run its SIGTERM handler once a loaded
        machine delays it: it would be SIGKILLed (137) where a real node lets it exit (143).
        """
        scale = self.config.time_scale if self.config.grace_scale is None else self.config.grace_scale
        return 0.0 if seconds <= 0 else max(seconds * scale, MIN_TERMINATION_GRACE_SECONDS)

    def allocate_ip(self) -> str:
        return self.ips.allocate(self.store.view("pods"))

    def free_gpus(self) -> list[int]:
        used = {g for w in self.workers.values() if not w.finished for g in w.gpus}
        return [i for i in range(self.node.gpus) if i not in used]

    def event(self, pod: dict[str, Any], reason: str, message: str, *, warning: bool = False,
              container: str | None = None) -> None:
        if not self.connected:
            return
        inits = {c.get("name") for c in pod["spec"].get("initContainers") or []}
        kind = "initContainers" if container in inits else "containers"
        self.store.record_event(
            involved(pod), reason, message, type="Warning" if warning else "Normal",
            component="kubelet", host=self.name,
            field_path=f"spec.{kind}{{{container}}}" if container else None)

    async def run(self) -> None:
        queue = self.store.subscribe()
        try:
            for pod in self.store.list("pods", field_selector=f"spec.nodeName={self.name}"):
                self.sync(pod)
            while True:
                event_type, resource, obj = await queue.get()
                if resource != "pods" or obj.get("spec", {}).get("nodeName") != self.name:
                    continue
                if event_type == "DELETED" and not self.connected:
                    # Cut off, the kubelet cannot see the object go: its containers run on
                    # (split brain) until it reconnects.
                    self.missed_deletions.append(obj)
                elif event_type == "DELETED":
                    self.forget(obj)
                elif self.connected:
                    self.sync(obj)
        finally:
            self.store.unsubscribe(queue)

    def sync(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if worker is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                if pod["metadata"].get("deletionTimestamp"):
                    finalize_deletion(self, pod)
                return
            worker = self.workers[uid] = PodWorker(self, pod)
            worker.start()
        worker.update(pod)

    def forget(self, pod: dict[str, Any]) -> None:
        """The pod object is gone: stop what is left and delete its files (evidence loss)."""
        worker = self.workers.pop(pod["metadata"]["uid"], None)
        if worker is not None:
            worker.abandon()
        shutil.rmtree(pod_dir(self.config.root, pod), ignore_errors=True)

    def find(self, namespace: str, name: str) -> PodWorker | None:
        for worker in self.workers.values():
            meta = worker.pod["metadata"]
            if (meta["namespace"], meta["name"]) == (namespace, name):
                return worker
        return None

    def kill_all(self) -> None:
        """A node crash: every container process dies at once, nothing is reported."""
        for worker in self.workers.values():
            worker.abandon()
        self.workers.clear()

    def reap(self, instance: runtime.Container) -> None:
        """Collect a killed instance in the background (closes its log, frees its cgroup)."""
        task = asyncio.ensure_future(instance.wait())
        self.reaping.add(task)
        task.add_done_callback(self.reaping.discard)
