"""The default scheduler: binds pending pods to nodes that fit them.

What belongs here: fit (node Ready and schedulable, nodeSelector, NoSchedule/NoExecute taints
against tolerations, cpu/memory/nvidia.com/gpu/pods requests against allocatable minus the
non-terminal pods already there, then required pod anti-affinity), the choice among fitting
nodes (preferred pod anti-affinity, then name order), binding with the `Scheduled` event, and the
`Unschedulable` condition plus `FailedScheduling` event in the scheduler's own words
(pkg/scheduler/framework/types.go FitError.Error, 1.32), and victim handling for preemption.

What does not: running pods (kubelet.py), node health (nodes.py), the affinity rules themselves
(affinity.py).
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

from kubesim import affinity, workload
from kubesim.store import Store, timestamp

COMPONENT = "default-scheduler"
_NOT_HELPFUL = "Preemption is not helpful for scheduling"
_NO_VICTIMS = "No preemption victims found for incoming pod"
_TOO_MANY_PODS = "Too many pods"
NO_NODES = "no nodes available to schedule pods"  # ErrNoNodesAvailable
NEVER = "not eligible due to preemptionPolicy=Never."
TERMINATING_VICTIM = "not eligible due to a terminating pod on the nominated node."


def tolerates(pod: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Whether one of the pod's tolerations matches the taint (v1 helper semantics)."""
    for tol in pod.get("spec", {}).get("tolerations") or []:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol["key"] == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _allocatable(node: dict[str, Any]) -> dict[str, Decimal]:
    raw = node.get("status", {}).get("allocatable") or {}
    return {k: workload.quantity(v) for k, v in raw.items()}


def _used(pods: list[dict[str, Any]], node_name: str) -> dict[str, Decimal]:
    used: dict[str, Decimal] = {}
    for pod in pods:
        if pod["spec"].get("nodeName") != node_name:
            continue
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for key, val in {**workload.requests_of(pod), "pods": Decimal(1)}.items():
            used[key] = used.get(key, Decimal(0)) + val
    return used


def failures(pod: dict[str, Any], node: dict[str, Any], pods: list[dict[str, Any]],
             nodes: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Why the pod does not fit the node, in FailedScheduling words; empty when it fits.

    Filters run in the default plugin order (NodeUnschedulable, TaintToleration,
    NodeAffinity, NodeResourcesFit, InterPodAffinity) and stop at the first that fails, as the
    scheduler's do. `nodes` (by name) places the other pods in their topology domains.
    """
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return ["node(s) were unschedulable"]
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(pod, taint):
            return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
    labels = node["metadata"].get("labels") or {}
    selector = pod["spec"].get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()) or not affinity.node_affinity_fits(
            pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    alloc, used = _allocatable(node), _used(pods, node["metadata"]["name"])
    wanted = {**workload.requests_of(pod), "pods": Decimal(1)}
    short = [_TOO_MANY_PODS if key == "pods" else f"Insufficient {key}"
             for key, amount in sorted(wanted.items())
             if amount > 0 and used.get(key, Decimal(0)) + amount > alloc.get(key, Decimal(0))]
    if short:
        return short
    anti = affinity.anti_affinity_failure(pod, node, pods,
                                          nodes or {node["metadata"]["name"]: node})
    return [anti] if anti else []


def _resolvable(reason: str) -> bool:
    """Whether evicting pods could cure this reason (so preemption is worth trying): the
    plugins' Unschedulable (not UnschedulableAndUnresolvable) statuses."""
    return reason.startswith("Insufficient ") or reason in (
        _TOO_MANY_PODS, affinity.ANTI_AFFINITY, affinity.EXISTING_ANTI_AFFINITY)


def find_victims(pod: dict[str, Any], node: dict[str, Any], pods: list[dict[str, Any]],
                 nodes: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Lower-priority pods whose removal lets the pod fit the node; empty when none does."""
    if not all(_resolvable(r) for r in failures(pod, node, pods, nodes)):
        return []
    priority = pod["spec"].get("priority") or 0
    name = node["metadata"]["name"]
    candidates = sorted((p for p in pods if p["spec"].get("nodeName") == name
                         and (p["spec"].get("priority") or 0) < priority
                         and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
                         and not p["metadata"].get("deletionTimestamp")),
                        key=lambda p: (p["spec"].get("priority") or 0,
                                       p["metadata"]["creationTimestamp"]))
    victims: list[dict[str, Any]] = []
    for candidate in candidates:
        victims.append(candidate)
        gone = {v["metadata"]["uid"] for v in victims}
        if not failures(pod, node, [p for p in pods if p["metadata"]["uid"] not in gone], nodes):
            return victims
    return []


def fit_error(n_nodes: int, reasons: dict[str, list[str]], preemption: str | None = None) -> str:
    """`0/N nodes are available: ...` with the preemption post-filter's words.

    `preemption` is what the post-filter said instead of trying (the pod may not preempt), or ""
    when it found victims (then it says nothing); None: it tried every node and found none.
    """
    if not n_nodes:
        return NO_NODES  # schedulePod gives up before any filter or post-filter runs
    # FitError.Error sorts the formatted "<count> <reason>" strings, count first.
    counts = Counter(r for rs in reasons.values() for r in rs)
    head = ", ".join(sorted(f"{n} {r}" for r, n in counts.items()))
    if preemption is None:
        helpful = Counter(_NO_VICTIMS if all(_resolvable(r) for r in rs) else _NOT_HELPFUL
                          for rs in reasons.values())
        tail = ", ".join(sorted(f"{n} {r}" for r, n in helpful.items()))
        preemption = f"0/{n_nodes} nodes are available: {tail}."
    return f"0/{n_nodes} nodes are available: {head}." + (
        f" preemption: {preemption}" if preemption else "")


def not_eligible(pod: dict[str, Any], pods: list[dict[str, Any]]) -> str | None:
    """Why the pod may not preempt others now (DefaultPreemption.PodEligibleToPreemptOthers)."""
    if pod["spec"].get("preemptionPolicy") == "Never":
        return NEVER
    nominated = (pod.get("status") or {}).get("nominatedNodeName")
    priority = pod["spec"].get("priority") or 0
    if nominated and any(p["spec"].get("nodeName") == nominated
                         and (p["spec"].get("priority") or 0) < priority
                         and p["metadata"].get("deletionTimestamp")
                         and any(c.get("type") == "DisruptionTarget"
                                 and c.get("reason") == "PreemptionByScheduler"
                                 for c in (p.get("status") or {}).get("conditions") or [])
                         for p in pods):
        return TERMINATING_VICTIM
    return None


class Scheduler:
    """Schedules on every pod or node change."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._reported: dict[str, str] = {}

    async def run(self) -> None:
        queue = self.store.subscribe()
        try:
            self.schedule_all()
            while True:
                burst = [await queue.get()]
                while not queue.empty():  # coalesce a burst of changes into one pass
                    burst.append(queue.get_nowait())
                # any pod or node change in the burst counts: the pods a Job controller creates
                # land behind its own Job and event writes
                if any(resource in ("pods", "nodes") for _, resource, _ in burst):
                    self.schedule_all()
        finally:
            self.store.unsubscribe(queue)

    def schedule_all(self) -> None:
        if not self.store.list("pods", field_selector="spec.nodeName="):
            return  # nothing pending: skip copying every pod on each change
        pods = self.store.list("pods")
        nodes = [n for n in self.store.list("nodes") if _ready(n)]
        all_nodes = self.store.list("nodes")
        pending = sorted((p for p in pods if not p["spec"].get("nodeName")
                          and not p["metadata"].get("deletionTimestamp")
                          and p["spec"].get("schedulerName", COMPONENT) == COMPONENT),
                         key=lambda p: (-(p["spec"].get("priority") or 0),
                                        p["metadata"]["creationTimestamp"]))
        by_name = {n["metadata"]["name"]: n for n in all_nodes}
        for pod in pending:
            reasons = {n["metadata"]["name"]: failures(pod, n, pods, by_name) for n in nodes}
            for node in all_nodes:
                if not _ready(node):
                    reasons[node["metadata"]["name"]] = [_not_ready_reason(node)]
            fitting = sorted((name for name, rs in reasons.items() if not rs), key=lambda name: (
                -affinity.preference(pod, by_name[name], pods, by_name), name))
            if fitting:
                pod["spec"]["nodeName"] = fitting[0]  # the next pending pod sees it placed
                self._bind(pod, fitting[0])
                continue
            why_not = not_eligible(pod, pods) if all_nodes else ""
            if why_not is None and self._preempt(pod, nodes, pods, by_name):
                why_not = ""  # victims found: the post-filter succeeded and says nothing
            self._unschedulable(pod, fit_error(len(all_nodes), reasons, why_not))

    def _preempt(self, pod: dict[str, Any], nodes: list[dict[str, Any]],
                 pods: list[dict[str, Any]], by_name: dict[str, dict[str, Any]]) -> bool:
        """Default preemption: on the first node where removing lower-priority pods (lowest
        first) makes room, delete them and nominate the node for the preemptor; False when no
        node has such victims."""
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            victims = find_victims(pod, node, pods, by_name)
            if not victims:
                continue
            meta = pod["metadata"]
            for victim in victims:
                vmeta = victim["metadata"]
                preempt_victim(self.store, vmeta["namespace"], vmeta["name"], meta["uid"])
            nominated = node["metadata"]["name"]
            self.store.mutate("pods", meta["namespace"], meta["name"], lambda obj: obj.setdefault(
                "status", {}).update(nominatedNodeName=nominated))
            return True
        return False

    def _bind(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]

        def bind(obj: dict[str, Any]) -> None:
            obj["spec"]["nodeName"] = node
            _set_condition(obj, "True", None, None)
            obj["status"].pop("nominatedNodeName", None)

        self.store.mutate("pods", meta["namespace"], meta["name"], bind)
        self.store.record_event(
            {"apiVersion": "v1", "kind": "Pod", "metadata": meta}, "Scheduled",
            f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
            component=COMPONENT)
        self._reported.pop(meta["uid"], None)

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        meta = pod["metadata"]
        self.store.mutate("pods", meta["namespace"], meta["name"],
                          lambda obj: _set_condition(obj, "False", "Unschedulable", message))
        if self._reported.get(meta["uid"]) != message:
            self._reported[meta["uid"]] = message
            self.store.record_event({"apiVersion": "v1", "kind": "Pod", "metadata": meta},
                                    "FailedScheduling", message, type="Warning",
                                    component=COMPONENT)


def _ready(node: dict[str, Any]) -> bool:
    for cond in node.get("status", {}).get("conditions") or []:
        if cond["type"] == "Ready":
            return bool(cond["status"] == "True")
    return False


def _not_ready_reason(node: dict[str, Any]) -> str:
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint["key"].startswith("node.kubernetes.io/"):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    return "node(s) were not ready"


def _set_condition(pod: dict[str, Any], status: str, reason: str | None,
                   message: str | None) -> None:
    conds = pod.setdefault("status", {}).setdefault("conditions", [])
    prev = next((c for c in conds if c["type"] == "PodScheduled"), None)
    cond: dict[str, Any] = {"type": "PodScheduled", "status": status, "lastProbeTime": None,
                            "lastTransitionTime": prev["lastTransitionTime"]
                            if prev and prev["status"] == status else timestamp()}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    pod["status"]["conditions"] = [c for c in conds if c["type"] != "PodScheduled"] + [cond]
    pod["status"].setdefault("phase", "Pending")


def preempt_victim(store: Store, namespace: str, name: str, preemptor_uid: str = "",
                   grace_seconds: int | None = None) -> dict[str, Any] | None:
    """Mark a pod as preempted and delete it gracefully, as the scheduler's preemption does."""
    pod = store.get("pods", namespace, name)
    if pod is None:
        return None
    node = pod["spec"].get("nodeName", "")
    message = f"{COMPONENT}: preempting to accommodate a higher priority pod"
    grace = grace_seconds if grace_seconds is not None else pod["spec"].get(
        "terminationGracePeriodSeconds", 30)

    def mark(obj: dict[str, Any]) -> None:
        conds = obj.setdefault("status", {}).setdefault("conditions", [])
        conds[:] = [c for c in conds if c["type"] != "DisruptionTarget"] + [{
            "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
            "message": message, "lastProbeTime": None, "lastTransitionTime": timestamp()}]
        obj["metadata"]["deletionTimestamp"] = timestamp()
        obj["metadata"]["deletionGracePeriodSeconds"] = grace

    store.record_event({"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]},
                       "Preempted", f"Preempted by pod {preemptor_uid or 'unknown'} on node {node}",
                       component=COMPONENT)
    return store.mutate("pods", namespace, name, mark)


