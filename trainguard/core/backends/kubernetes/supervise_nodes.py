"""Following an attempt of several pods (one per node rank) to its end, with the same two watches.

`NodesSupervisor` is the single-pod `Supervisor` taught that an attempt is N pods: it follows every
pod's log, each line prefixed with its node rank (`[node 1] ...`), and ends the attempt when:

- the Job is Complete, or Failed (in hold mode that is once every index has ended);
- a pod failed (its own error, or a disruption) and then either every other index ended as well,
  or the survivors' grace ran out: they usually fail on their own within seconds of losing a peer,
  and what they print meanwhile dates the failure. Without hold mode (clusters before 1.29) the
  Job controller deletes the survivors at once, so the attempt ends at once, to read them while
  they terminate;
- one pod is unschedulable (refused, or never decided on) or cannot start for longer than allowed, the whole attempt is silent
  for `stall_seconds`, or it outlived its deadline; or the Job was deleted;
- where one pod per node may be relaxed, a pod is unschedulable because of it (`placement.SPREAD`).

The pod that failed first is the outcome's pod; every pod seen is in `Ending.pods`. Like the
single-pod supervisor it never deletes anything.
"""

from __future__ import annotations

from typing import Any

from trainguard.core.backends.kubernetes import indexed, placement
from trainguard.core.backends.kubernetes.podstate import (
    START_ERRORS, Wire, blocking_wait, has_condition, job_condition, not_scheduled, pod_terminal, unschedulable_since,
)
from trainguard.core.backends.kubernetes.supervise import Supervisor
from trainguard.core.backends.waits import span

FIRST_FAILURE = "first-failure"


def pod_failed(pod: Wire) -> bool:
    """Failed, or marked for a disruption (its failure is on its way: the node is draining, it is evicted)."""
    return (pod.get("status") or {}).get("phase") == "Failed" or has_condition(pod, "DisruptionTarget")


class NodesSupervisor(Supervisor):
    """Watches one attempt of `nodes` pods (an Indexed Job's, or a PyTorchJob's) until it is over."""

    def __init__(self, *args: Any, nodes: int, grace_seconds: float, hold: bool = True,
                 index_of: Any = indexed.index_of, relaxable: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nodes, self.grace_seconds, self.hold, self.index_of = nodes, grace_seconds, hold, index_of
        self.relaxable = relaxable  # one pod per node is required and may become preferred
        self.first_failed: str | None = None
        self.said_grace = False

    def _apply_pod(self, pod: Wire) -> None:
        name = str(pod["metadata"]["name"])
        self.ending.pods[name] = pod
        if self.first_failed is None and pod_failed(pod):
            self.first_failed = name
        chosen = self.first_failed or min(self.ending.pods, key=self._order)
        self.ending.pod = self.ending.pods[chosen]
        index = self.index_of(pod)
        self._follow(pod, f"[node {index}] " if index is not None else f"[{name}] ")

    def _waiting_pods(self) -> list[Wire]:
        return list(self.ending.pods.values())

    def _order(self, name: str) -> tuple[int, str]:
        index = self.index_of(self.ending.pods[name])
        return (index if index is not None else self.nodes, name)

    def _settle(self, why: str) -> None:
        self._read_pods()  # the final state of every pod, whatever the watch had delivered

    def _ended_indexes(self) -> set[int]:
        return {i for p in self.ending.pods.values() if pod_terminal(p) and (i := self.index_of(p)) is not None}

    def _verdict(self, started: float) -> str:
        ending, now = self.ending, self.clock()
        if ending.why:
            return ending.why
        if len(self.listed) < 2:
            return ""
        job = ending.job or {}
        if job_condition(job, *self.done):
            return "job"
        if job_condition(job, "Failed") and self.first_failed is None:
            return "job"  # a PyTorchJob failed with no pod of it failed (its deadline): nothing to wait for
        if self.first_failed is not None:
            if not self.hold or job_condition(job, "FailureTarget"):
                return "pod"  # the controller is deleting the survivors: read them now
            ended_all = len(self._ended_indexes()) >= self.nodes
            if ended_all or self._lasted(FIRST_FAILURE, True, now) >= self.grace_seconds:
                return "pod"
            if not self.said_grace:  # a wait of up to the grace: say it once, with its bound
                self.said_grace = True
                self._say(f"pod {self.first_failed} failed; waiting up to {span(self.grace_seconds)} for the other "
                          "pods to end on their own (what they print meanwhile dates the failure)")
            return ""
        succeeded = [p for p in ending.pods.values() if (p.get("status") or {}).get("phase") == "Succeeded"]
        if len(self._ended_indexes()) >= self.nodes and len(succeeded) >= self.nodes:
            if self._lasted("pod-ended", True, now) >= self.limits.settle_seconds:
                return "pod"
        if ending.job_deleted:
            return "deleted"
        blocked = [p for p in ending.pods.values() if placement.blocked_by_spread(p)] if self.relaxable else []
        if blocked:
            ending.pod, ending.message = blocked[0], str(placement.blocked_by_spread(blocked[0]))
            return placement.SPREAD
        return self._waited_too_long(self._stuck(), started, now)

    def _stuck(self) -> Wire | None:
        """The pod that keeps the attempt waiting (unschedulable, or unable to start), else the outcome's."""
        pods = list(self.ending.pods.values())
        # the scheduler's refusal says most; then a pod no scheduler decided on; then one that cannot start
        found = next((p for p in pods if unschedulable_since(p) is not None), None) or \
            next((p for p in pods if not_scheduled(p)), None) or \
            next((p for p in pods if blocking_wait(p).get("reason") in START_ERRORS), None)
        if found is not None:
            self.ending.pod = found
        return found or self.ending.pod
