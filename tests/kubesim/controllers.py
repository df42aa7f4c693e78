"""Wiring of the node-side controllers, and the node/pod faults the control API calls.

What belongs here: `start(store, config)` (node objects, one kubelet per node, the pod IP
pool and cluster DNS they share, scheduler, job controller, PyTorchJob controller, node
lifecycle) and the fault entry points `oom_kill`, `evict`, `preempt`, `partition`, `crash`,
`heal`, `delete_node`. Each raises kubesim.errors.NotFound with a one-line message naming
what was not found, which the control API answers as 404.

What does not: the behaviour itself (kubelet.py, scheduler.py, jobs.py, pytorchjob.py,
nodes.py).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from kubesim import mounts, runtime
from kubesim.config import SimConfig
from kubesim.dns import ClusterDns
from kubesim.errors import NotFound
from kubesim.jobs import JobController
from kubesim.kubelet import Kubelet, PodWorker
from kubesim.network import PodIps
from kubesim.nodes import NodeLifecycle, node_object
from kubesim.pytorchjob import PyTorchJobController
from kubesim.scheduler import Scheduler, preempt_victim
from kubesim.store import AlreadyExists, Store

log = logging.getLogger("kubesim.controllers")


@dataclass
class Cluster:
    """The node side of one running simulation."""

    store: Store
    config: SimConfig
    memory: runtime.MemoryControl
    ips: PodIps
    dns: ClusterDns
    kubelets: dict[str, Kubelet] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    background: set[asyncio.Future[Any]] = field(default_factory=set)


_clusters: dict[int, Cluster] = {}


def start(store: Store, config: SimConfig) -> list[asyncio.Task[None]]:
    """Register the nodes and start every node-side controller as an asyncio task."""
    memory = runtime.MemoryControl.detect()
    cluster = Cluster(store, config, memory, PodIps(), ClusterDns(store, config.root))
    _clusters[id(store)] = cluster
    for index, spec in enumerate(config.nodes, start=1):
        try:
            store.create("nodes", node_object(spec, index))
        except AlreadyExists:
            pass
        kubelet = Kubelet(store, spec, config, memory, index, ips=cluster.ips, dns=cluster.dns)
        cluster.kubelets[spec.name] = kubelet
        cluster.tasks[f"kubelet/{spec.name}"] = asyncio.ensure_future(kubelet.run())
    cluster.tasks["scheduler"] = asyncio.ensure_future(Scheduler(store).run())
    cluster.tasks["job-controller"] = asyncio.ensure_future(
        JobController(store, config.time_scale).run())
    cluster.tasks["pytorchjob-controller"] = asyncio.ensure_future(
        PyTorchJobController(store).run())
    cluster.tasks["cluster-dns"] = asyncio.ensure_future(cluster.dns.run())
    cluster.tasks["node-lifecycle"] = asyncio.ensure_future(
        NodeLifecycle(store, config, cluster.kubelets).run())
    _announce_fallbacks(store, config, memory, cluster.dns)
    return list(cluster.tasks.values())


def _announce_fallbacks(store: Store, config: SimConfig, memory: runtime.MemoryControl,
                        dns: ClusterDns) -> None:
    """Warning events on each Node, so a test can see (and skip on) a less faithful node."""
    fallbacks = []
    if memory.mode == "watchdog":
        fallbacks.append(("MemoryLimitsEmulated",
                          "no writable memory cgroup: limits enforced by an RSS watchdog"))
    if not mounts.available():
        fallbacks.append(("MountsRewritten", "no mount namespaces: volumes are reached through "
                          "KUBESIM_MOUNT_* and rewritten paths, not at their mountPath"))
    if dns.library is None:
        fallbacks.append(("PodDNSUnavailable", "libnss_wrapper.so not found (Debian package "
                          "libnss-wrapper): pod and Service names do not resolve in containers"))
    for spec in config.nodes:
        node = store.get("nodes", None, spec.name) or {}
        for reason, message in fallbacks:
            store.record_event(node, reason, message, type="Warning", component="kubelet",
                               host=spec.name)


async def shutdown(store: Store | None = None) -> None:
    """Kill every container process, reap them, then remove the cgroups (server shutdown)."""
    for key, cluster in list(_clusters.items()):
        if store is not None and key != id(store):
            continue
        for task in cluster.tasks.values():
            task.cancel()
        for kubelet in cluster.kubelets.values():
            kubelet.kill_all()
        reaping = [f for f in cluster.background if not f.done()]
        reaping += [f for k in cluster.kubelets.values() for f in k.reaping if not f.done()]
        if reaping:
            await asyncio.wait(reaping, timeout=5)
        cluster.memory.close()
        cluster.ips.close()
        _clusters.pop(key, None)
    mounts.remove_targets()


def set_api_url(url: str, store: Store | None = None) -> None:
    """Tell containers where the API is (KUBERNETES_SERVICE_HOST/PORT)."""
    for cluster in _cluster_list(store):
        for kubelet in cluster.kubelets.values():
            kubelet.api_url = url


def _cluster_list(store: Store | None) -> list[Cluster]:
    if store is not None:
        return [c for k, c in _clusters.items() if k == id(store)]
    return list(_clusters.values())


def _cluster(store: Store | None) -> Cluster:
    found = _cluster_list(store)
    if not found:
        raise NotFound("kubesim controllers are not running")
    return found[0]


def _worker(store: Store, namespace: str, pod: str) -> PodWorker:
    for kubelet in _cluster(store).kubelets.values():
        worker = kubelet.find(namespace, pod)
        if worker is not None:
            return worker
    raise NotFound(f'pod "{pod}" in namespace "{namespace}" is not running on any node')


def _spawn(cluster: Cluster, coro: Any) -> None:
    task = asyncio.ensure_future(coro)
    cluster.background.add(task)
    task.add_done_callback(cluster.background.discard)


def oom_kill(store: Store, namespace: str, pod: str, container: str | None = None) -> dict[str, Any]:
    """Kill a running container as the kernel OOM killer would: 137, reason OOMKilled."""
    worker = _worker(store, namespace, pod)
    running = [c for c in worker.all_containers if c.instance is not None
               and (container is None or c.name == container)]
    if not running:
        raise NotFound(f'container "{container or "(any)"}" of pod "{pod}" is not running')
    running[0].instance.oom_kill()  # type: ignore[union-attr]
    return {"namespace": namespace, "pod": pod, "container": running[0].name}


def evict(store: Store, namespace: str, pod: str, resource: str = "memory") -> dict[str, Any]:
    """Node-pressure eviction by the kubelet: phase Failed, reason Evicted, 137."""
    worker = _worker(store, namespace, pod)
    _spawn(_cluster(store), worker.evict(resource))
    return {"namespace": namespace, "pod": pod, "resource": resource}


def preempt(store: Store, namespace: str, pod: str, grace_seconds: int | None = None) -> dict[str, Any]:
    """The scheduler preempts this pod for a higher-priority one (DisruptionTarget, delete)."""
    if preempt_victim(store, namespace, pod, grace_seconds=grace_seconds) is None:
        raise NotFound(f'pods "{pod}" not found')
    return {"namespace": namespace, "pod": pod}


def _kubelet(node: str, store: Store | None) -> Kubelet:
    kubelet = _cluster(store).kubelets.get(node)
    if kubelet is None:
        raise NotFound(f'nodes "{node}" not found')
    return kubelet


def partition(node: str, store: Store | None = None) -> dict[str, Any]:
    """Cut the node off: heartbeats and status writes stop, its processes keep running."""
    _kubelet(node, store).connected = False
    return {"node": node, "state": "partitioned"}


def crash(node: str, store: Store | None = None) -> dict[str, Any]:
    """The node dies: every container process is killed and heartbeats stop."""
    kubelet = _kubelet(node, store)
    kubelet.connected = False
    kubelet.kill_all()
    return {"node": node, "state": "crashed"}


def heal(node: str, store: Store | None = None) -> dict[str, Any]:
    """Reconnect the node: heartbeats resume and the kubelet resyncs its pods."""
    kubelet = _kubelet(node, store)
    kubelet.connected = True
    missed, kubelet.missed_deletions = kubelet.missed_deletions, []
    for pod in missed:
        kubelet.forget(pod)
    for pod in kubelet.store.list("pods", field_selector=f"spec.nodeName={node}"):
        kubelet.sync(pod)
    for worker in kubelet.workers.values():
        worker.publish()  # what changed while cut off reaches the API now
    return {"node": node, "state": "healthy"}


def delete_node(node: str, store: Store | None = None) -> dict[str, Any]:
    """Crash the node and delete its Node object, so pod GC fails and removes its pods."""
    crash(node, store)
    kubelet = _kubelet(node, store)
    kubelet.store.remove("nodes", None, node)  # its Lease follows through the garbage collector
    return {"node": node, "state": "deleted"}
