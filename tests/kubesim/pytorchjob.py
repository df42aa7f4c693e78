"""The PyTorchJob controller: kubeflow/training-operator v1.9.0's reconcile loop, in process.

What belongs here: one pod and one headless Service per replica (Master first), recreating a
failed pod under OnFailure/Always (and ExitCode for exit codes of 128 and above), the
`replicaStatuses` counts (Running pods are active, Succeeded/Failed counted, Pending nothing),
the conditions and events of pkg/controller.v1/pytorch/pytorchjob_controller.go UpdateJobStatus
and common/job.go ReconcileJobs (Created, Running, Restarting, Succeeded, Failed with reasons
`PyTorchJob<Type>`, Running turned False once the job ends), runPolicy.backoffLimit on restart
counts, activeDeadlineSeconds, cleanPodPolicy (None keeps every pod, Running deletes the live
ones, All deletes all) and ttlSecondsAfterFinished.

What does not: the objects themselves (kubeflow.py), running pods (kubelet), cascading deletes
(gc.py). Not emulated: suspend, gang scheduling, elastic jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime
from typing import Any

from kubesim import admission, kubeflow
from kubesim.deletion import delete_object
from kubesim.errors import ApiError
from kubesim.store import Store, timestamp

KIND = "PyTorchJob"
_TERMINAL = ("Succeeded", "Failed")
_DEBOUNCE_SECONDS = 0.02


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _true(status: dict[str, Any], ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in status.get("conditions") or [])


def set_condition(status: dict[str, Any], ctype: str, value: str, reason: str,
                  message: str) -> None:
    """util.UpdateJobConditions: nothing changes once Failed; Running and Restarting replace
    each other; Succeeded or Failed turn Running False."""
    if _true(status, "Failed"):
        return
    conds = status.get("conditions") or []
    current = next((c for c in conds if c["type"] == ctype), None)
    if current is not None and current["status"] == value and current.get("reason") == reason:
        return
    now = timestamp()
    new = {"type": ctype, "status": value, "reason": reason, "message": message,
           "lastUpdateTime": now,
           "lastTransitionTime": current["lastTransitionTime"]
           if current is not None and current["status"] == value else now}
    kept = []
    for cond in conds:
        if cond["type"] == ctype or {cond["type"], ctype} == {"Running", "Restarting"}:
            continue
        if ctype in ("Failed", "Succeeded") and cond["type"] == "Running":
            cond = {**cond, "status": "False"}
        kept.append(cond)
    status["conditions"] = kept + [new]


class PyTorchJobController:
    """Reconciles every PyTorchJob on each change of jobs, pods or services."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._due: list[float] = []

    async def run(self) -> None:
        queue = self.store.subscribe()
        try:
            while True:
                wait = max(min(self._due) - time.time(), 0.05) if self._due else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._next_change(queue), wait)
                self.sync_all()
        finally:
            self.store.unsubscribe(queue)

    @staticmethod
    async def _next_change(queue: asyncio.Queue[tuple[str, str, dict[str, Any]]]) -> None:
        while True:
            _, resource, _ = await queue.get()
            if resource in ("pytorchjobs", "pods", "services"):
                await asyncio.sleep(_DEBOUNCE_SECONDS)
                while not queue.empty():
                    queue.get_nowait()
                return

    def sync_all(self) -> None:
        self._due = []
        for job in self.store.list("pytorchjobs"):
            if job["metadata"].get("deletionTimestamp"):
                continue
            try:
                self.sync(job)
            except ApiError as exc:  # a racing delete: the next pass sees the new state
                if exc.code not in (404, 409):
                    raise

    def _owned(self, resource: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        return [o for o in self.store.list(resource, job["metadata"]["namespace"])
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]

    def event(self, job: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        self.store.record_event(job, reason, message, type="Warning" if warning else "Normal",
                                component="pytorchjob-controller")

    def sync(self, job: dict[str, Any]) -> None:
        """ReconcileJobs for one job."""
        name = job["metadata"]["name"]
        status: dict[str, Any] = dict(job.get("status") or {})
        if not any(c["type"] == "Created" for c in status.get("conditions") or []):
            set_condition(status, "Created", "True", f"{KIND}Created",
                          f"{KIND} {name} is created.")
        pods = self._owned("pods", job)
        if _true(status, "Succeeded") or _true(status, "Failed"):
            self._clean_up(job, status, pods)
            self._expire(job, status)
            return self._write(job, status)
        run = job["spec"].get("runPolicy") or {}
        status.setdefault("startTime", timestamp())
        failure = self._past_limits(job, run, status, pods)
        if failure is not None:
            status.setdefault("completionTime", timestamp())
            self._delete(job, [p for p in pods if not p["metadata"].get("deletionTimestamp")])
            self.event(job, f"{KIND}Failed", failure)
            set_condition(status, "Failed", "True", f"{KIND}Failed", failure)
            return self._write(job, status)
        status["replicaStatuses"] = {}
        services = {s["metadata"]["name"] for s in self._owned("services", job)}
        for rtype in self._types(job):
            self._reconcile_pods(job, status, pods, rtype)
            self._reconcile_services(job, services, rtype)
        self._update_status(job, status)
        return self._write(job, status)

    def _types(self, job: dict[str, Any]) -> list[str]:
        specs = job["spec"].get("pytorchReplicaSpecs") or {}
        return [t for t in kubeflow.TYPES if t in specs]

    def _past_limits(self, job: dict[str, Any], run: dict[str, Any], status: dict[str, Any],
                     pods: list[dict[str, Any]]) -> str | None:
        name = job["metadata"]["name"]
        limit = run.get("backoffLimit")
        if limit is not None:
            restarts = sum(int(cs.get("restartCount", 0)) for p in pods
                           if p.get("status", {}).get("phase") == "Running"
                           and self._restarts_count(job, p)
                           for cs in (p["status"].get("containerStatuses") or [])
                           + (p["status"].get("initContainerStatuses") or []))
            if (restarts > 0) if int(limit) == 0 else (restarts >= int(limit)):
                return f"Job {name} has failed because it has reached the specified backoff limit"
        deadline = run.get("activeDeadlineSeconds")
        if deadline is not None:
            ends = _epoch(status["startTime"]) + int(deadline)
            self._due.append(ends)
            if time.time() >= ends:
                return (f"Job {name} has failed because it was active longer than specified "
                        "deadline")
        return None

    @staticmethod
    def _restarts_count(job: dict[str, Any], pod: dict[str, Any]) -> bool:
        # core.PastBackoffLimit counts only replicas restarted in place or recreated.
        rtype = (pod["metadata"].get("labels") or {}).get(f"{kubeflow.LABEL}replica-type", "")
        spec = (job["spec"].get("pytorchReplicaSpecs") or {}).get(rtype.capitalize()) or {}
        return spec.get("restartPolicy", "OnFailure") in ("OnFailure", "Always", "ExitCode")

    def _reconcile_pods(self, job: dict[str, Any], status: dict[str, Any],
                        pods: list[dict[str, Any]], rtype: str) -> None:
        spec = job["spec"]["pytorchReplicaSpecs"][rtype]
        counts = status["replicaStatuses"].setdefault(rtype, {})
        label = f"{kubeflow.LABEL}replica-type"
        mine = [p for p in pods if (p["metadata"].get("labels") or {}).get(label) == rtype.lower()]
        for index in range(int(spec.get("replicas", 1))):
            found = [p for p in mine if (p["metadata"].get("labels") or {}).get(
                f"{kubeflow.LABEL}replica-index") == str(index)]
            if not found:
                self._create_pod(job, rtype, index)
                continue
            self._check_pod(job, status, spec, rtype, found[0], counts)

    def _create_pod(self, job: dict[str, Any], rtype: str, index: int) -> None:
        spec = job["spec"]["pytorchReplicaSpecs"][rtype]
        if ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy"):
            self.event(job, "SetPodTemplateRestartPolicy", "Restart policy in pod template "
                       "will be overwritten by restart policy in replica spec", warning=True)
        pod = kubeflow.pod(job, rtype, index)
        admission.default("pods", pod)
        created = self.store.create("pods", pod)
        self.event(job, "SuccessfulCreatePod", f"Created pod: {created['metadata']['name']}")

    def _check_pod(self, job: dict[str, Any], status: dict[str, Any], spec: dict[str, Any],
                   rtype: str, pod: dict[str, Any], counts: dict[str, Any]) -> None:
        meta, phase = pod["metadata"], pod.get("status", {}).get("phase")
        code = None
        for cs in pod.get("status", {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated")
            if cs["name"] == kubeflow.CONTAINER and terminated:
                code = int(terminated["exitCode"])
                self.event(job, "ExitedWithCode", f"Pod: {meta['namespace']}.{meta['name']} "
                           f"exited with code {code}")
        policy = spec.get("restartPolicy", "OnFailure")
        if phase == "Failed" and not meta.get("deletionTimestamp"):
            retryable = code is not None and code >= 128
            name = job["metadata"]["name"]
            if policy in ("OnFailure", "Always") or (policy == "ExitCode" and retryable):
                self._delete(job, [pod], services=False)
                message = f"job {name} is restarting because {rtype} replica(s) failed."
                self.event(job, f"{KIND}Restarting", message, warning=True)
                set_condition(status, "Restarting", "True", f"{KIND}Restarting", message)
            elif policy == "ExitCode":
                message = f'job "{name}" is failing because "{rtype}" replica(s) failed.'
                self.event(job, f"{KIND}Failed", message, warning=True)
                set_condition(status, "Failed", "True", f"{KIND}Failed", message)
        if phase == "Running":
            key = "failed" if meta.get("deletionTimestamp") else "active"
            counts[key] = counts.get(key, 0) + 1
        elif phase in _TERMINAL:
            key = phase.lower()
            counts[key] = counts.get(key, 0) + 1

    def _reconcile_services(self, job: dict[str, Any], existing: set[str], rtype: str) -> None:
        spec = job["spec"]["pytorchReplicaSpecs"][rtype]
        for index in range(int(spec.get("replicas", 1))):
            wanted = kubeflow.service(job, rtype, index)
            if wanted["metadata"]["name"] in existing:
                continue
            admission.default("services", wanted)
            created = self.store.create("services", wanted)
            self.event(job, "SuccessfulCreateService",
                       f"Created service: {created['metadata']['name']}")

    def _update_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        """UpdateJobStatus: the Master decides Running and Succeeded (Workers without one)."""
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        specs = job["spec"]["pytorchReplicaSpecs"]
        for rtype in self._types(job):  # Go's map order varies; every type gets its selector
            selector = kubeflow.labels(name, rtype)
            status["replicaStatuses"][rtype]["selector"] = ",".join(
                f"{k}={v}" for k, v in sorted(selector.items()))
        for rtype in self._types(job):
            counts = status["replicaStatuses"][rtype]
            replicas = int(specs[rtype].get("replicas", 1))
            running, succeeded = counts.get("active", 0), counts.get("succeeded", 0)
            failed = counts.get("failed", 0)
            lead = rtype == "Master" or "Master" not in specs
            if lead and succeeded >= replicas:
                message = (f"{KIND} {name} is successfully completed." if rtype == "Master"
                           else f"{KIND} {namespace}/{name} successfully completed.")
                self.event(job, f"{KIND}Succeeded", message)
                status.setdefault("completionTime", timestamp())
                set_condition(status, "Succeeded", "True", f"{KIND}Succeeded", message)
                return
            if lead and running > 0:
                message = (f"{KIND} {name} is running." if rtype == "Master"
                           else f"{KIND} {namespace}/{name} is running.")
                set_condition(status, "Running", "True", f"{KIND}Running", message)
            if failed > 0 and replicas > succeeded + running:
                self._replica_failed(job, status, rtype, failed)

    def _replica_failed(self, job: dict[str, Any], status: dict[str, Any], rtype: str,
                        failed: int) -> None:
        name = job["metadata"]["name"]
        if job["spec"]["pytorchReplicaSpecs"][rtype].get("restartPolicy") != "Never":
            message = f"{KIND} {name} is restarting because {failed} {rtype} replica(s) failed."
            self.event(job, f"{KIND}Restarting", message, warning=True)
            set_condition(status, "Restarting", "True", f"{KIND}Restarting", message)
            return
        message = f"{KIND} {name} is failed because {failed} {rtype} replica(s) failed."
        self.event(job, f"{KIND}Failed", message)
        status.setdefault("completionTime", timestamp())
        set_condition(status, "Failed", "True", f"{KIND}Failed", message)

    def _clean_up(self, job: dict[str, Any], status: dict[str, Any],
                  pods: list[dict[str, Any]]) -> None:
        """DeletePodsAndServices after the end, by cleanPodPolicy."""
        policy = (job["spec"].get("runPolicy") or {}).get("cleanPodPolicy", "None")
        doomed = [] if policy == "None" else [
            p for p in pods if not p["metadata"].get("deletionTimestamp")
            and (policy == "All" or p.get("status", {}).get("phase") in ("Running", "Pending"))]
        self._delete(job, doomed)
        if _true(status, "Succeeded"):
            for counts in (status.get("replicaStatuses") or {}).values():
                if counts.get("active"):
                    counts["succeeded"] = counts.get("succeeded", 0) + counts.pop("active")

    def _delete(self, job: dict[str, Any], pods: list[dict[str, Any]],
                services: bool = True) -> None:
        for pod in pods:
            namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            delete_object(self.store, "pods", namespace, name)
            self.event(job, "SuccessfulDeletePod", f"Deleted pod: {name}")
            if services and self.store.get("services", namespace, name) is not None:
                delete_object(self.store, "services", namespace, name)  # same name as its pod
                self.event(job, "SuccessfulDeleteService", f"Deleted service: {name}")

    def _expire(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        ttl = (job["spec"].get("runPolicy") or {}).get("ttlSecondsAfterFinished")
        if ttl is None or not status.get("completionTime"):
            return
        expires = _epoch(status["completionTime"]) + int(ttl)
        self._due.append(expires)
        if time.time() > expires:
            meta = job["metadata"]
            delete_object(self.store, "pytorchjobs", meta["namespace"], meta["name"],
                          propagation="Background")
            # DeleteJob records the pod reason with the job's name, as the operator does.
            self.event(job, "SuccessfulDeletePod", f"Deleted job: {meta['name']}")

    def _write(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        if status == (job.get("status") or {}):
            return

        def put(obj: dict[str, Any]) -> None:
            obj["status"] = status

        self.store.mutate("pytorchjobs", job["metadata"]["namespace"], job["metadata"]["name"],
                          put)
