"""Indexed Jobs (batch/v1 `completionMode: Indexed`) against the documented Kubernetes behaviour.

Oracles: the Job concept page (Completion mode; Backoff limit per index; Job success policy;
Pod failure policy with FailIndex; Job termination and cleanup), the JobStatus API reference
(`completedIndexes`/`failedIndexes`: "Three or more consecutive numbers are compressed and
represented by the first and last element of the series, separated by a hyphen"), and the job
controller's condition reasons and messages (pkg/controller/job, 1.32). Every container is a
real local process; the official client reads what the API shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from waiting import wait_for

from kubesim import indexes

IMAGE = "python:3.11"
INDEX = "batch.kubernetes.io/job-completion-index"
# Waits (bounded) until the file named by argv[1] exists: the test decides when a pod may end.
HOLD = ("import os, sys, time\nend = time.time() + 60\n"
        "while not os.path.exists(sys.argv[1]) and time.time() < end:\n    time.sleep(0.05)\n")


def indexed_job(name: str, code: str, completions: int, *args: str,
                **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completionMode": "Indexed", "completions": completions,
                     "parallelism": completions, **spec, "template": {"spec": {
                         "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                         "containers": [{"name": "train", "image": IMAGE,
                                         "command": ["python", "-c", code, *args]}]}}}}


def status(batch: client.BatchV1Api, ns: str, name: str) -> dict[str, Any]:
    raw = batch.read_namespaced_job_status(name, ns, _preload_content=False).data
    return dict(json.loads(raw)["status"])


def condition(batch: client.BatchV1Api, ns: str, name: str, ctype: str) -> dict[str, Any] | None:
    return next((c for c in status(batch, ns, name).get("conditions") or []
                 if c["type"] == ctype and c["status"] == "True"), None)


def pods_by_index(core: client.CoreV1Api, ns: str, name: str) -> dict[int, list[client.V1Pod]]:
    found: dict[int, list[client.V1Pod]] = {}
    for pod in core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items:
        found.setdefault(int(pod.metadata.annotations[INDEX]), []).append(pod)
    return found


def events(core: client.CoreV1Api, ns: str, name: str) -> list[str]:
    return [e.reason for e in core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}").items]


@pytest.mark.parametrize(("given", "text"), [
    ([1, 3, 4, 5, 7], "1,3-5,7"),  # the API reference's own example
    ([0, 2, 3], "0,2,3"),  # two consecutive indexes stay a pair
    ([0, 1, 2], "0-2"), ([4], "4"), ([], ""),
])
def test_index_sets_render_as_the_job_status_interval_strings(given: list[int],
                                                              text: str) -> None:
    assert indexes.render(given) == text
    assert indexes.parse(text, 10) == set(given)


@pytest.mark.parametrize(("rules", "succeeded", "matched"), [
    ([{"succeededIndexes": "0"}], {0}, "Matched rules at index 0"),
    ([{"succeededIndexes": "0-2"}], {0, 2}, None),  # every listed index must succeed
    ([{"succeededIndexes": "0-2", "succeededCount": 2}], {0, 2}, "Matched rules at index 0"),
    ([{"succeededIndexes": "1"}, {"succeededCount": 2}], {0, 2}, "Matched rules at index 1"),
    ([{"succeededCount": 3}], {0, 2}, None),
])
def test_success_policy_rules_match_as_the_job_success_policy_documents(
        rules: list[dict[str, Any]], succeeded: set[int], matched: str | None) -> None:
    job = {"spec": {"completions": 4, "successPolicy": {"rules": rules}}}
    assert indexes.success_policy(job, succeeded) == matched


def test_each_indexed_pod_carries_its_index_and_the_job_lists_completed_indexes(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    """Completion mode Indexed: the index in the annotation and label, JOB_COMPLETION_INDEX,
    hostname `<job>-<index>`, pods named `<job>-<index>-<random>`."""
    code = ("import os, socket\nprint(os.environ['JOB_COMPLETION_INDEX'], os.environ['HOSTNAME'],"
            " socket.gethostname(), flush=True)")
    spec = indexed_job("shard", code, 3)
    spec["spec"]["template"]["spec"]["subdomain"] = "shard"
    batch.create_namespaced_job(ns, spec)
    complete = wait_for(lambda: condition(batch, ns, "shard", "Complete"), what="Complete")
    assert complete["reason"] == "CompletionsReached"
    found = status(batch, ns, "shard")
    assert (found["succeeded"], found["completedIndexes"], found["failed"]) == (3, "0-2", 0)
    assert "failedIndexes" not in found  # only with a backoff limit per index
    for index, (pod,) in pods_by_index(core, ns, "shard").items():
        assert pod.metadata.name.startswith(f"shard-{index}-")
        assert pod.metadata.labels[INDEX] == str(index)
        assert (pod.spec.hostname, pod.spec.subdomain) == (f"shard-{index}", "shard")
        log = core.read_namespaced_pod_log(pod.metadata.name, ns, _preload_content=False)
        assert log.data.decode() == f"{index} shard-{index} shard-{index}\n"


def test_a_failed_index_is_retried_up_to_its_own_limit_and_counts_its_failures(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path) -> None:
    """Backoff limit per index: index 0 fails once and is retried; the replacement carries
    batch.kubernetes.io/job-index-failure-count 1."""
    code = ("import os, sys\nmark = os.path.join(sys.argv[1], os.environ['JOB_COMPLETION_INDEX'])\n"
            "if os.environ['JOB_COMPLETION_INDEX'] == '0' and not os.path.exists(mark):\n"
            "    open(mark, 'w').close(); sys.exit(1)\n")
    batch.create_namespaced_job(ns, indexed_job("retry", code, 2, str(tmp_path),
                                                backoffLimitPerIndex=1))
    wait_for(lambda: condition(batch, ns, "retry", "Complete"), what="Complete")
    found = status(batch, ns, "retry")
    assert (found["failed"], found["succeeded"], found["completedIndexes"]) == (1, 2, "0,1")
    assert found["failedIndexes"] == ""
    tries = {p.metadata.annotations["batch.kubernetes.io/job-index-failure-count"]: p.status.phase
             for p in pods_by_index(core, ns, "retry")[0]}
    assert tries == {"0": "Failed", "1": "Succeeded"}
    assert batch.read_namespaced_job("retry", ns).spec.backoff_limit == 2147483647


def test_hold_mode_a_failed_index_is_not_retried_and_the_other_pods_keep_running(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path) -> None:
    """backoffLimitPerIndex 0: "the Job executes all indexes"; it fails with FailedIndexes only
    once every index has finished, and deletes no pod."""
    release = tmp_path / "release"
    code = "import os, sys\nif os.environ['JOB_COMPLETION_INDEX'] == '1': sys.exit(3)\n" + HOLD
    batch.create_namespaced_job(ns, indexed_job("hold", code, 2, str(release),
                                                backoffLimitPerIndex=0))
    wait_for(lambda: status(batch, ns, "hold").get("failedIndexes") == "1",
             what="index 1 failed")
    survivor = pods_by_index(core, ns, "hold")[0][0]
    assert survivor.status.phase in ("Pending", "Running")
    assert condition(batch, ns, "hold", "FailureTarget") is None
    assert len(pods_by_index(core, ns, "hold")[1]) == 1  # not retried
    release.touch()
    failed = wait_for(lambda: condition(batch, ns, "hold", "Failed"), what="Failed")
    assert (failed["reason"], failed["message"]) == ("FailedIndexes", "Job has failed indexes")
    target = condition(batch, ns, "hold", "FailureTarget")
    assert target is not None and target["reason"] == "FailedIndexes"
    found = status(batch, ns, "hold")
    assert (found["completedIndexes"], found["failedIndexes"], found["failed"]) == ("0", "1", 1)
    assert core.read_namespaced_pod(survivor.metadata.name, ns).status.phase == "Succeeded"
    assert "SuccessfulDelete" not in events(core, ns, "hold")


def test_backoff_limit_0_without_a_per_index_limit_terminates_the_other_pods(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path) -> None:
    """Job termination: past backoffLimit the Job's running pods are terminated (SIGTERM)."""
    code = ("import os, sys\nif os.environ['JOB_COMPLETION_INDEX'] == '1': sys.exit(3)\n"
            + HOLD)
    batch.create_namespaced_job(ns, indexed_job("strict", code, 2, str(tmp_path / "never"),
                                                backoffLimit=0))
    failed = wait_for(lambda: condition(batch, ns, "strict", "Failed"), what="Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    other = pods_by_index(core, ns, "strict").get(0, [])
    assert not other or other[0].metadata.deletion_timestamp or other[0].status.phase == "Failed"
    assert "SuccessfulDelete" in events(core, ns, "strict")


def test_more_failed_indexes_than_max_failed_indexes_fails_the_job_at_once(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path) -> None:
    code = ("import os, sys\nif os.environ['JOB_COMPLETION_INDEX'] == '2': sys.exit(3)\n"
            + HOLD)
    batch.create_namespaced_job(ns, indexed_job("capped", code, 3, str(tmp_path / "never"),
                                                backoffLimitPerIndex=0, maxFailedIndexes=0))
    failed = wait_for(lambda: condition(batch, ns, "capped", "Failed"), what="Failed")
    assert (failed["reason"], failed["message"]) == (
        "MaxFailedIndexesExceeded",
        "Job has exceeded the specified maximal number of failed indexes")
    assert status(batch, ns, "capped")["failedIndexes"] == "2"
    assert events(core, ns, "capped").count("SuccessfulDelete") == 2  # indexes 0 and 1


def test_a_fail_index_rule_fails_the_index_without_using_its_retries(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    """Pod failure policy FailIndex: the index fails at once although backoffLimitPerIndex
    would allow retries; the other index completes, then the Job fails with FailedIndexes."""
    code = "import os, sys\nsys.exit(42 if os.environ['JOB_COMPLETION_INDEX'] == '1' else 0)"
    policy = {"rules": [{"action": "FailIndex", "onExitCodes": {
        "containerName": "train", "operator": "In", "values": [42]}}]}
    batch.create_namespaced_job(ns, indexed_job("fatal", code, 2, backoffLimitPerIndex=3,
                                                podFailurePolicy=policy))
    failed = wait_for(lambda: condition(batch, ns, "fatal", "Failed"), what="Failed")
    assert failed["reason"] == "FailedIndexes"
    found = status(batch, ns, "fatal")
    assert (found["failedIndexes"], found["completedIndexes"]) == ("1", "0")
    assert len(pods_by_index(core, ns, "fatal")[1]) == 1


def test_a_success_policy_completes_the_job_and_terminates_the_lingering_pods(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path) -> None:
    """Job success policy: once a rule matches, SuccessCriteriaMet then Complete with reason
    SuccessPolicy, and "the Job controller terminates the lingering Pods"."""
    code = "import os, sys\nif os.environ['JOB_COMPLETION_INDEX'] != '0':\n" + "".join(
        "    " + line + "\n" for line in HOLD.splitlines())
    batch.create_namespaced_job(ns, indexed_job(
        "leader", code, 3, str(tmp_path / "never"),
        successPolicy={"rules": [{"succeededIndexes": "0"}]}))
    complete = wait_for(lambda: condition(batch, ns, "leader", "Complete"), what="Complete")
    assert (complete["reason"], complete["message"]) == ("SuccessPolicy",
                                                         "Matched rules at index 0")
    met = condition(batch, ns, "leader", "SuccessCriteriaMet")
    assert met is not None and met["reason"] == "SuccessPolicy"
    assert status(batch, ns, "leader")["completedIndexes"] == "0"
    assert events(core, ns, "leader").count("SuccessfulDelete") == 2


@pytest.mark.parametrize(("spec", "field", "message"), [
    ({"completionMode": "Indexed"}, "spec.completions",
     "Required value: when completion mode is Indexed"),
    ({"backoffLimitPerIndex": 1}, "spec.backoffLimitPerIndex",
     "Invalid value: 1: requires indexed completion mode"),
    ({"completionMode": "Indexed", "completions": 2, "maxFailedIndexes": 1},
     "spec.backoffLimitPerIndex", "Required value: when maxFailedIndexes is specified"),
    ({"completionMode": "Indexed", "completions": 2, "podFailurePolicy": {"rules": [
        {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [1]}}]}},
     "spec.podFailurePolicy.rules[0].action",
     'Invalid value: "FailIndex": requires the backoffLimitPerIndex to be set'),
])
def test_indexed_only_fields_are_validated_in_the_apiservers_words(
        batch: client.BatchV1Api, ns: str, spec: dict[str, Any], field: str,
        message: str) -> None:
    body = indexed_job("bad", "pass", 1)
    body["spec"] = {k: v for k, v in body["spec"].items()
                    if k not in ("completionMode", "completions", "parallelism")} | spec
    with pytest.raises(ApiException) as refused:
        batch.create_namespaced_job(ns, body)
    causes = json.loads(refused.value.body)["details"]["causes"]
    assert refused.value.status == 422
    assert {"field": field, "message": message, "reason": causes[0]["reason"]} in causes
