"""The Job controller and the TTL-after-finished controller (Kubernetes 1.32 behaviour).

What belongs here: creating pods from the template (ownerReference, job-tracking finalizer,
`SuccessfulCreate`), recreation back-off, counting terminal pods once (the finalizer goes
when counted), backoffLimit (OnFailure restarts included), what podFailurePolicy actions do
(FailJob/FailIndex/Ignore/Count), activeDeadlineSeconds, Indexed Jobs (a pod per pending index,
completedIndexes, backoffLimitPerIndex with failedIndexes and maxFailedIndexes, successPolicy),
the two-step FailureTarget -> Failed and SuccessCriteriaMet -> Complete conditions, suspend, and
deleting a finished Job after ttlSecondsAfterFinished. Texts follow pkg/controller/job.

What does not: index arithmetic (indexes.py), matching failure policy rules (podfailure.py),
running pods (kubelet.py) or cascading deletes (gc.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from datetime import datetime
from typing import Any

from kubesim import admission, indexes
from kubesim.deletion import delete_object
from kubesim.errors import ApiError
from kubesim.podfailure import match_pod_failure_policy
from kubesim.store import Store, timestamp

COMPONENT = "job-controller"
TRACKING = "batch.kubernetes.io/job-tracking"
BACKOFF_START_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 360.0
_TICK_SECONDS = 0.1
MESSAGES = {
    "BackoffLimitExceeded": "Job has reached the specified backoff limit",
    "DeadlineExceeded": "Job was active longer than specified deadline",
    "MaxFailedIndexesExceeded": "Job has exceeded the specified maximal number of failed indexes",
    "FailedIndexes": "Job has failed indexes",
}
_TERMINAL = ("Succeeded", "Failed")
_SUCCESS = ("CompletionsReached", "SuccessPolicy")


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _condition(job: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in job.get("status", {}).get("conditions") or []:
        if cond["type"] == ctype and cond["status"] == "True":
            return dict(cond)
    return None


def _add_condition(status: dict[str, Any], ctype: str, reason: str, message: str, *,
                   value: str = "True") -> None:
    now = timestamp()
    conds = [c for c in status.get("conditions") or [] if c["type"] != ctype]
    conds.append({"type": ctype, "status": value, "reason": reason, "message": message,
                  "lastProbeTime": now, "lastTransitionTime": now})
    status["conditions"] = conds


class JobController:
    """Reconciles every Job on each job/pod change and on a short tick (deadlines, back-off)."""

    def __init__(self, store: Store, time_scale: float) -> None:
        self.store = store
        self.time_scale = time_scale
        self._not_before: dict[str, float] = {}
        self._due: list[float] = []  # epoch seconds at which a Job needs another look

    async def run(self) -> None:
        queue = self.store.subscribe()
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._next_change(queue), self._until_due())
                self.sync_all()
        finally:
            self.store.unsubscribe(queue)

    @staticmethod
    async def _next_change(queue: asyncio.Queue[tuple[str, str, dict[str, Any]]]) -> None:
        while True:
            _, resource, _ = await queue.get()
            if resource in ("jobs", "pods"):
                while not queue.empty():  # one pass serves a burst of changes
                    queue.get_nowait()
                return

    def _until_due(self) -> float | None:
        """Seconds until a deadline, back-off or TTL falls due; None when nothing is timed."""
        if not self._due:
            return None
        return max(min(self._due) - time.time(), _TICK_SECONDS)

    def sync_all(self) -> None:
        self._due = [t for t in self._not_before.values() if t > time.time()]
        jobs, pods = self.store.list("jobs"), self.store.list("pods")
        owned: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            for ref in pod["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Job":
                    owned.setdefault(ref.get("uid", ""), []).append(pod)
        self._release_orphans(jobs, pods)
        for job in jobs:
            try:
                self.sync(job, owned.get(job["metadata"]["uid"], []))
            except ApiError as exc:  # a racing delete: the next pass sees the new state
                if exc.code != 404:
                    raise

    def _release_orphans(self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        """Pods whose Job is gone or being deleted lose the tracking finalizer at once, so a
        Foreground or Orphan delete of the Job is not held up by them."""
        live = {j["metadata"]["uid"] for j in jobs if not j["metadata"].get("deletionTimestamp")}
        for pod in pods:
            if TRACKING not in (pod["metadata"].get("finalizers") or []):
                continue
            owners = {r.get("uid") for r in pod["metadata"].get("ownerReferences") or []
                      if r.get("kind") == "Job"}
            if not owners & live:
                self._strip_finalizer(pod)

    def sync(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """Reconcile one Job given the pods it owns."""
        if _condition(job, "Complete") or _condition(job, "Failed"):
            self._release(job, pods)
            self._expire(job)
            return
        if job["metadata"].get("deletionTimestamp"):
            return
        status = dict(job.get("status") or {})
        suspended = bool(job["spec"].get("suspend"))
        if suspended:
            status.pop("startTime", None)  # the deadline clock stops while suspended
        else:
            status.setdefault("startTime", timestamp())
        deadline = job["spec"].get("activeDeadlineSeconds")
        if deadline is not None and "startTime" in status:
            self._due.append(_epoch(status["startTime"]) + int(deadline))
        newly_failed = self._count(job, pods, status)
        verdict = self._verdict(job, pods, status, newly_failed)
        active = [p for p in pods if p["status"].get("phase") not in _TERMINAL
                  and not p["metadata"].get("deletionTimestamp")]
        if verdict is None and _condition(job, "FailureTarget") is None:
            if int(status.get("succeeded", 0)) >= int(job["spec"].get("completions") or 1):
                verdict = ("CompletionsReached", "Reached expected number of succeeded pods")
            elif suspended:
                self._suspend(job, active, status)
            else:
                self._resume(job, status)
                self._create(job, active, pods, status)
        self._finish(job, pods, status, verdict)

    def _count(self, job: dict[str, Any], pods: list[dict[str, Any]],
               status: dict[str, Any]) -> list[dict[str, Any]]:
        """Count terminal pods once, dropping their tracking finalizer; returns new failures."""
        failed: list[dict[str, Any]] = []
        indexed, per_index = indexes.indexed(job), indexes.per_index(job)
        completions = int(job["spec"].get("completions") or 1)
        done = indexes.parse(status.get("completedIndexes"), completions)
        lost = indexes.parse(status.get("failedIndexes"), completions)
        for pod in pods:
            phase, index = pod["status"].get("phase"), indexes.of(pod)
            if phase not in _TERMINAL or TRACKING not in (pod["metadata"].get("finalizers") or []):
                continue
            valid = index is not None and index < completions
            if phase == "Succeeded" and indexed:
                done.update([index] if valid else [])  # one success per index counts
            elif phase == "Succeeded":
                status["succeeded"] = int(status.get("succeeded", 0)) + 1
            else:
                match = match_pod_failure_policy(job, pod)
                counted = match is None or match[0] != "Ignore"
                if counted:
                    status["failed"] = int(status.get("failed", 0)) + 1
                    failed.append(pod)
                if counted and not per_index:  # indexes back off one by one (_create_indexed)
                    self._not_before[job["metadata"]["uid"]] = time.time() + self._backoff(
                        int(status["failed"]))
                action = match[0] if match else None
                # Pods terminated for a failing Job count, but fail no index (syncJob).
                ending = _condition(job, "FailureTarget") is not None
                if per_index and valid and not ending and indexes.fails_index(job, pod, action,
                                                                              counted):
                    lost.add(int(index or 0))
            self._strip_finalizer(pod)
        if indexed:
            status["succeeded"], status["completedIndexes"] = len(done), indexes.render(done)
            if not done:
                status.pop("completedIndexes")  # omitempty
        if per_index:
            status["failedIndexes"] = indexes.render(lost)
        return failed

    def _backoff(self, failures: int) -> float:
        seconds = min(BACKOFF_START_SECONDS * 2 ** max(failures - 1, 0), BACKOFF_MAX_SECONDS)
        return float(seconds) * self.time_scale

    def _strip_finalizer(self, pod: dict[str, Any]) -> None:
        def strip(obj: dict[str, Any]) -> None:
            fins = [f for f in obj["metadata"].get("finalizers") or [] if f != TRACKING]
            if fins:
                obj["metadata"]["finalizers"] = fins
            else:
                obj["metadata"].pop("finalizers", None)

        self.store.mutate("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], strip)

    def _verdict(self, job: dict[str, Any], pods: list[dict[str, Any]], status: dict[str, Any],
                 newly_failed: list[dict[str, Any]]) -> tuple[str, str] | None:
        for interim in ("SuccessCriteriaMet", "FailureTarget"):
            target = _condition(job, interim)
            if target is not None:
                return target["reason"], target["message"]
        for pod in newly_failed:
            match = match_pod_failure_policy(job, pod)
            if match is not None and match[0] == "FailJob":
                return "PodFailurePolicy", match[1]
        spec = job["spec"]
        limit = int(spec.get("backoffLimit", 6))
        if int(status.get("failed", 0)) > limit or self._past_limit_on_failure(job, pods, limit):
            return "BackoffLimitExceeded", MESSAGES["BackoffLimitExceeded"]
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and "startTime" in status and (
                time.time() - _epoch(status["startTime"]) >= int(deadline)):
            return "DeadlineExceeded", MESSAGES["DeadlineExceeded"]
        return self._index_verdict(job, status)

    def _index_verdict(self, job: dict[str, Any], status: dict[str, Any]
                       ) -> tuple[str, str] | None:
        """Failed indexes end a Job once every index is done, or at once past
        maxFailedIndexes; a matched successPolicy rule ends it well (syncJob, 1.32)."""
        if not indexes.indexed(job):
            return None
        completions = int(job["spec"]["completions"])
        lost = len(indexes.parse(status.get("failedIndexes"), completions))
        most = job["spec"].get("maxFailedIndexes")
        if indexes.per_index(job) and most is not None and lost > int(most):
            return "MaxFailedIndexesExceeded", MESSAGES["MaxFailedIndexesExceeded"]
        if indexes.per_index(job) and lost and lost + int(status["succeeded"]) >= completions:
            return "FailedIndexes", MESSAGES["FailedIndexes"]
        matched = indexes.success_policy(
            job, indexes.parse(status.get("completedIndexes"), completions))
        return ("SuccessPolicy", matched) if matched else None

    def _past_limit_on_failure(self, job: dict[str, Any], pods: list[dict[str, Any]],
                               limit: int) -> bool:
        # pastBackoffLimitOnFailure: OnFailure restarts of active pods count against the limit.
        if job["spec"]["template"]["spec"].get("restartPolicy") != "OnFailure":
            return False
        restarts = sum(int(cs.get("restartCount", 0)) for p in pods
                       if p["status"].get("phase") not in _TERMINAL
                       for cs in (p["status"].get("containerStatuses") or [])
                       + (p["status"].get("initContainerStatuses") or []))
        return restarts > 0 if limit == 0 else restarts >= limit

    def _create(self, job: dict[str, Any], active: list[dict[str, Any]],
                pods: list[dict[str, Any]], status: dict[str, Any]) -> None:
        spec = job["spec"]
        # podReplacementPolicy Failed: a terminating pod still holds its place (and index).
        live = active if spec.get("podReplacementPolicy") != "Failed" else [
            p for p in pods if p["status"].get("phase") not in _TERMINAL]
        wanted = min(int(spec.get("parallelism", 1)),
                     int(spec.get("completions") or 1) - int(status.get("succeeded", 0)))
        if len(live) >= wanted:
            return
        if not indexes.per_index(job) and time.time() < self._not_before.get(
                job["metadata"]["uid"], 0):
            return
        if indexes.indexed(job):
            return self._create_indexed(job, live, pods, status, wanted - len(live))
        for _ in range(wanted - len(live)):
            self._create_pod(job)

    def _create_indexed(self, job: dict[str, Any], busy: list[dict[str, Any]],
                        pods: list[dict[str, Any]], status: dict[str, Any], count: int) -> None:
        """A pod for each of the lowest pending indexes. With a limit per index, each index waits
        out its own back-off from its last failed pod, whose failure counts carry over."""
        completions = int(job["spec"]["completions"])
        chosen = indexes.pending(
            job, {i for i in map(indexes.of, busy) if i is not None},
            indexes.parse(status.get("completedIndexes"), completions),
            indexes.parse(status.get("failedIndexes"), completions), count)
        for index in chosen:
            failures = [p for p in pods if indexes.of(p) == index
                        and p["status"].get("phase") == "Failed"]
            last = max(failures, key=indexes.finished_at, default=None)
            if last is not None and indexes.per_index(job):
                tries = indexes.absolute_failures(last) + 1
                ready = indexes.finished_at(last) + self._backoff(tries)
                if time.time() < ready:
                    self._due.append(ready)
                    continue
            match = match_pod_failure_policy(job, last) if last is not None else None
            self._create_pod(job, index, last, match is None or match[0] != "Ignore")

    def _create_pod(self, job: dict[str, Any], index: int | None = None,
                    replaced: dict[str, Any] | None = None, counted: bool = True) -> None:
        meta, template = job["metadata"], copy.deepcopy(job["spec"]["template"])
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}
        pod: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {**template.get("metadata", {}), "generateName": f"{meta['name']}-",
                         "namespace": meta["namespace"], "finalizers": [TRACKING],
                         "ownerReferences": [owner]},
            "spec": template.get("spec", {})}
        pod["metadata"].pop("name", None)
        if index is not None:
            extra = indexes.template(job, index, replaced, counted)
            pod["metadata"]["generateName"] = extra["generateName"]
            for key in ("annotations", "labels"):
                pod["metadata"][key] = {**(pod["metadata"].get(key) or {}), **extra[key]}
            pod["spec"]["hostname"] = extra["hostname"]
            indexes.add_index_env(pod["spec"])
        admission.default("pods", pod)
        created = self.store.create("pods", pod)
        self.store.record_event(job, "SuccessfulCreate",
                                f"Created pod: {created['metadata']['name']}",
                                component=COMPONENT)

    def _delete_pods(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") or pod["status"].get("phase") in _TERMINAL:
                continue
            delete_object(self.store, "pods", meta["namespace"], meta["name"])
            self.store.record_event(job, "SuccessfulDelete", f"Deleted pod: {meta['name']}",
                                    component=COMPONENT)

    def _suspend(self, job: dict[str, Any], active: list[dict[str, Any]],
                 status: dict[str, Any]) -> None:
        self._delete_pods(job, active)
        if not any(c["type"] == "Suspended" and c["status"] == "True"
                   for c in status.get("conditions") or []):
            _add_condition(status, "Suspended", "JobSuspended", "Job suspended")
            self.store.record_event(job, "Suspended", "Job suspended", component=COMPONENT)

    def _resume(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        if any(c["type"] == "Suspended" and c["status"] == "True"
               for c in status.get("conditions") or []):
            _add_condition(status, "Suspended", "JobResumed", "Job resumed", value="False")
            self.store.record_event(job, "Resumed", "Job resumed", component=COMPONENT)

    def _finish(self, job: dict[str, Any], pods: list[dict[str, Any]], status: dict[str, Any],
                verdict: tuple[str, str] | None) -> None:
        if verdict is not None:
            reason, message = verdict
            success = reason in _SUCCESS
            first, final = ("SuccessCriteriaMet", "Complete") if success else (
                "FailureTarget", "Failed")
            if not any(c["type"] == first for c in status.get("conditions") or []):
                _add_condition(status, first, reason, message)
            self._delete_pods(job, pods)
            if not [p for p in pods if p["status"].get("phase") not in _TERMINAL]:
                _add_condition(status, final, reason, message)
                if success:
                    status["completionTime"] = timestamp()
                    self.store.record_event(job, "Completed", "Job completed",
                                            component=COMPONENT)
                else:
                    self.store.record_event(job, reason, message, type="Warning",
                                            component=COMPONENT)
        self._write_status(job, pods, status)

    def _write_status(self, job: dict[str, Any], pods: list[dict[str, Any]],
                      status: dict[str, Any]) -> None:
        live = [p for p in pods if p["status"].get("phase") not in _TERMINAL]
        status["active"] = len([p for p in live if not p["metadata"].get("deletionTimestamp")])
        status["terminating"] = len(live) - status["active"]
        status["ready"] = len([p for p in live if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions") or [])])
        status.setdefault("failed", 0)
        status.setdefault("succeeded", 0)
        status["uncountedTerminatedPods"] = {}
        self.store.mutate("jobs", job["metadata"]["namespace"], job["metadata"]["name"],
                          lambda obj: obj.update(status=status))

    def _release(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """A finished Job still drops the tracking finalizer of pods that end later."""
        for pod in pods:
            if TRACKING in (pod["metadata"].get("finalizers") or []) and (
                    pod["status"].get("phase") in _TERMINAL):
                self._strip_finalizer(pod)

    def _expire(self, job: dict[str, Any]) -> None:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        done = _condition(job, "Complete") or _condition(job, "Failed")
        if ttl is None or done is None or job["metadata"].get("deletionTimestamp"):
            return
        self._due.append(_epoch(done["lastTransitionTime"]) + int(ttl))
        if time.time() - _epoch(done["lastTransitionTime"]) >= int(ttl):
            meta = job["metadata"]
            delete_object(self.store, "jobs", meta["namespace"], meta["name"],
                          propagation="Background")
