"""Job scenarios on the simulated cluster, driven and judged by the official kubernetes client.

Every container here is a real local process: exit codes, restarts, logs and OOM kills are
real. Shapes are checked by deserializing into the client's own models.
"""

from __future__ import annotations

import json
from typing import Any

import kubesim
from cluster_helpers import shape
from waiting import wait_for
from kubernetes import client, watch

IMAGE = "python:3.11"


def job(name: str, code: str, *, restart: str = "Never", memory: str | None = None,
        **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "train", "image": IMAGE,
                                 "command": ["python", "-c", code]}
    if memory:
        container["resources"] = {"limits": {"memory": memory}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {**spec, "template": {"spec": {
                "restartPolicy": restart, "terminationGracePeriodSeconds": 5,
                "containers": [container]}}}}


def condition(batch: client.BatchV1Api, ns: str, name: str, ctype: str) -> Any:
    found = batch.read_namespaced_job_status(name, ns)
    return next((c for c in found.status.conditions or [] if c.type == ctype), None)


def job_pods(core: client.CoreV1Api, ns: str, name: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items


def pod_log(core: client.CoreV1Api, ns: str, pod: str, **kw: Any) -> str:
    # kubernetes 36 returns the repr of the bytes ("b'...'") from read_namespaced_pod_log
    # (kubernetes-client/python#2596); the raw response is the text the API sent.
    return str(core.read_namespaced_pod_log(pod, ns, _preload_content=False, **kw).data.decode())


def events_for(core: client.CoreV1Api, ns: str, name: str) -> list[client.CoreV1Event]:
    return core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items


def test_a_container_exiting_1_under_on_failure_restarts_and_keeps_its_previous_log(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    code = "import os, sys; print('attempt in', os.getcwd()); sys.exit(1)"
    batch.create_namespaced_job(ns, job("flaky", code, restart="OnFailure", backoffLimit=20))

    def restarted() -> client.V1ContainerStatus | None:
        pods = job_pods(core, ns, "flaky")
        statuses = pods[0].status.container_statuses if pods else None
        return statuses[0] if statuses and statuses[0].restart_count >= 1 else None

    status = wait_for(restarted, what="a restart")
    pod_name = job_pods(core, ns, "flaky")[0].metadata.name
    assert status.last_state.terminated.exit_code == 1
    assert status.last_state.terminated.reason == "Error"
    previous = pod_log(core, ns, pod_name, previous=True)
    assert previous.startswith("attempt in ")
    reasons = {e.reason for e in events_for(core, ns, pod_name)}
    assert {"Scheduled", "Created", "Started", "BackOff"} <= reasons


def test_a_container_over_its_memory_limit_ends_oom_killed_with_137(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    greedy = "b = []\nwhile True:\n    b.append(bytearray(8 * 1024 * 1024))\n"
    batch.create_namespaced_job(ns, job("hungry", greedy, memory="64Mi", backoffLimit=0))
    failed = wait_for(lambda: condition(batch, ns, "hungry", "Failed"), what="Failed")
    assert (failed.reason, failed.message) == (
        "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    terminated = job_pods(core, ns, "hungry")[0].status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")


def test_pod_failure_policy_fail_job_on_exit_42_fails_the_job_at_the_first_failure(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    policy = {"rules": [{"action": "FailJob",
                         "onExitCodes": {"containerName": "train", "operator": "In",
                                         "values": [42]}}]}
    batch.create_namespaced_job(ns, job("fatal", "import sys; sys.exit(42)", backoffLimit=6,
                                        podFailurePolicy=policy))
    failed = wait_for(lambda: condition(batch, ns, "fatal", "Failed"), what="Failed")
    pod = job_pods(core, ns, "fatal")[0].metadata.name
    expected = (f"Container train for pod {ns}/{pod} failed with exit code 42 matching "
                "FailJob rule at index 0")
    assert (failed.reason, failed.message) == ("PodFailurePolicy", expected)
    target = condition(batch, ns, "fatal", "FailureTarget")
    assert (target.reason, target.message) == ("PodFailurePolicy", expected)
    found = batch.read_namespaced_job_status("fatal", ns)
    assert found.status.failed == 1 and len(job_pods(core, ns, "fatal")) == 1
    assert any(e.reason == "PodFailurePolicy" and e.type == "Warning"
               for e in events_for(core, ns, "fatal"))


def test_pod_failure_policy_ignore_does_not_count_the_failure(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    # The first attempt exits 3 (ignored), the second succeeds: a marker file on a PVC
    # tells them apart, which also proves the claim's folder outlives the pod.
    code = ("import os, sys\nmark = '/ckpt/seen'\n"
            "if os.path.exists(mark): sys.exit(0)\nopen(mark, 'w').close(); sys.exit(3)")
    spec = job("ignored", code, backoffLimit=0, podFailurePolicy={"rules": [
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [3]}}]})
    pod_spec = spec["spec"]["template"]["spec"]
    pod_spec["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    pod_spec["containers"][0]["volumeMounts"] = [{"name": "ckpt", "mountPath": "/ckpt"}]
    batch.create_namespaced_job(ns, spec)
    wait_for(lambda: condition(batch, ns, "ignored", "Complete"), what="Complete")
    found = batch.read_namespaced_job_status("ignored", ns)
    assert (found.status.failed, found.status.succeeded) == (0, 1)


def test_backoff_limit_counts_failed_pods_and_fails_the_job_with_both_conditions(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    batch.create_namespaced_job(ns, job("twice", "import sys; sys.exit(2)", backoffLimit=1))
    failed = wait_for(lambda: condition(batch, ns, "twice", "Failed"), what="Failed")
    assert failed.reason == "BackoffLimitExceeded"
    found = batch.read_namespaced_job_status("twice", ns)
    assert found.status.failed == 2 and found.status.active == 0
    assert [c.type for c in found.status.conditions] == ["FailureTarget", "Failed"]
    assert all(p.metadata.finalizers is None for p in job_pods(core, ns, "twice"))
    created = [e for e in events_for(core, ns, "twice") if e.reason == "SuccessfulCreate"]
    assert len(created) == 2 and created[0].message.startswith("Created pod: twice-")


def test_active_deadline_fails_the_job_with_deadline_exceeded_and_stops_its_pod(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    code = "import time; print('training', flush=True); time.sleep(60)"
    batch.create_namespaced_job(ns, job("slow", code, activeDeadlineSeconds=1, backoffLimit=3))
    failed = wait_for(lambda: condition(batch, ns, "slow", "Failed"), what="Failed")
    assert (failed.reason, failed.message) == (
        "DeadlineExceeded", "Job was active longer than specified deadline")
    wait_for(lambda: not job_pods(core, ns, "slow") or None, what="the pod to go")
    reasons = [e.reason for e in events_for(core, ns, "slow")]
    assert "DeadlineExceeded" in reasons and "SuccessfulDelete" in reasons


def test_a_succeeding_job_completes_in_two_steps_with_completion_time(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    batch.create_namespaced_job(ns, job("fine", "print('ok')"))
    complete = wait_for(lambda: condition(batch, ns, "fine", "Complete"), what="Complete")
    assert (complete.reason, complete.message) == (
        "CompletionsReached", "Reached expected number of succeeded pods")
    found = batch.read_namespaced_job_status("fine", ns)
    assert [c.type for c in found.status.conditions] == ["SuccessCriteriaMet", "Complete"]
    assert found.status.completion_time is not None and found.status.succeeded == 1
    pod = job_pods(core, ns, "fine")[0]
    assert pod.status.phase == "Succeeded"
    assert pod_log(core, ns, pod.metadata.name) == "ok\n"
    raw = json.loads(batch.read_namespaced_job("fine", ns, _preload_content=False).data)
    assert shape(raw, "V1Job").status.conditions[1].type == "Complete"


def test_ttl_after_finished_deletes_the_job_and_its_pods(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    created = batch.create_namespaced_job(ns, job("brief", "print('bye')",
                                                  ttlSecondsAfterFinished=1))
    # At this time scale the Job lives ~20 ms once Complete: a poll can miss it, a watch from
    # its creation cannot.
    states = _job_states_until_deleted(batch, ns, created)
    assert any(c.type == "Complete" and c.status == "True"
               for j in states for c in j.status.conditions or [])
    wait_for(lambda: not job_pods(core, ns, "brief") or None, what="its pods to go")


def _job_states_until_deleted(batch: client.BatchV1Api, ns: str,
                              created: client.V1Job) -> list[client.V1Job]:
    """Every state of a Job from its creation until the watch reports it deleted."""
    states: list[client.V1Job] = []
    for event in watch.Watch().stream(batch.list_namespaced_job, ns,
                                      field_selector=f"metadata.name={created.metadata.name}",
                                      resource_version=created.metadata.resource_version,
                                      timeout_seconds=20):
        if event["type"] == "DELETED":
            return states
        states.append(event["object"])
    raise AssertionError(f"job {created.metadata.name} was not deleted within 20s")


def test_init_containers_run_first_and_a_failing_one_fails_a_never_pod(
        core: client.CoreV1Api, ns: str) -> None:
    def with_init(name: str, init_code: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            "restartPolicy": "Never",
            "initContainers": [{"name": "fetch", "image": IMAGE,
                                "command": ["python", "-c", init_code]}],
            "containers": [{"name": "train", "image": IMAGE,
                            "command": ["python", "-c", "print('training')"]}]}}

    core.create_namespaced_pod(ns, with_init("ready", "print('fetched')"))
    core.create_namespaced_pod(ns, with_init("broken", "import sys; sys.exit(7)"))
    ok = wait_for(lambda: (p := core.read_namespaced_pod("ready", ns)).status.phase
                  == "Succeeded" and p, what="ready Succeeded")
    init = ok.status.init_container_statuses[0]
    assert (init.state.terminated.exit_code, init.ready) == (0, True)
    assert pod_log(core, ns, "ready", container="fetch") == "fetched\n"
    bad = wait_for(lambda: (p := core.read_namespaced_pod("broken", ns)).status.phase
                   == "Failed" and p, what="broken Failed")
    assert bad.status.init_container_statuses[0].state.terminated.exit_code == 7
    assert bad.status.container_statuses[0].state.waiting.reason == "PodInitializing"
    initialized = next(c for c in bad.status.conditions if c.type == "Initialized")
    assert (initialized.status, initialized.reason, initialized.message) == (
        "False", "ContainersNotInitialized", "containers with incomplete status: [fetch]")


def test_a_suspended_job_runs_nothing_until_resumed(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    batch.create_namespaced_job(ns, job("later", "print('resumed')", suspend=True))
    suspended = wait_for(lambda: condition(batch, ns, "later", "Suspended"), what="Suspended")
    assert (suspended.status, suspended.reason, suspended.message) == (
        "True", "JobSuspended", "Job suspended")
    # The moment it would have run: the controller has since started and finished a later job.
    batch.create_namespaced_job(ns, job("witness", "print('ran')"))
    wait_for(lambda: condition(batch, ns, "witness", "Complete"), what="the witness job Complete")
    assert job_pods(core, ns, "later") == []
    assert batch.read_namespaced_job_status("later", ns).status.start_time is None
    batch.patch_namespaced_job("later", ns, {"spec": {"suspend": False}})
    wait_for(lambda: condition(batch, ns, "later", "Complete"), what="Complete")
    resumed = condition(batch, ns, "later", "Suspended")
    assert (resumed.status, resumed.reason, resumed.message) == (
        "False", "JobResumed", "Job resumed")


def test_an_evicted_pod_matching_an_ignore_rule_is_replaced_without_counting(
        sim: kubesim.fixture.Sim, core: client.CoreV1Api, batch: client.BatchV1Api,
        ns: str) -> None:
    code = ("import os, sys, time\nmark = '/ckpt/started'\n"
            "if os.path.exists(mark): sys.exit(0)\n"
            "open(mark, 'w').close(); print('up', flush=True); time.sleep(60)")
    spec = job("preemptible", code, backoffLimit=0, podFailurePolicy={"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]})
    pod_spec = spec["spec"]["template"]["spec"]
    pod_spec["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "evict"}}]
    pod_spec["containers"][0]["volumeMounts"] = [{"name": "ckpt", "mountPath": "/ckpt"}]
    batch.create_namespaced_job(ns, spec)

    def first_running() -> str | None:
        pods = job_pods(core, ns, "preemptible")
        statuses = (pods[0].status.container_statuses or []) if pods else []
        # Until its container runs the pod has no log to read: the API answers 400.
        if not (statuses and statuses[0].state.running):
            return None
        name: str = pods[0].metadata.name
        return name if "up" in pod_log(core, ns, name) else None

    sim.evict(ns, wait_for(first_running, what="the first pod running"))
    wait_for(lambda: condition(batch, ns, "preemptible", "Complete"), what="Complete")
    found = batch.read_namespaced_job_status("preemptible", ns)
    assert (found.status.failed, found.status.succeeded) == (0, 1)
    phases = sorted(p.status.phase for p in job_pods(core, ns, "preemptible"))
    assert phases == ["Failed", "Succeeded"]


def test_parallel_completions_run_side_by_side_and_all_count(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    batch.create_namespaced_job(ns, job("pair", "print('shard done')", parallelism=2,
                                        completions=3))
    wait_for(lambda: condition(batch, ns, "pair", "Complete"), what="Complete")
    found = batch.read_namespaced_job_status("pair", ns)
    assert (found.status.succeeded, found.status.active, found.status.failed) == (3, 0, 0)
    assert len(job_pods(core, ns, "pair")) == 3
