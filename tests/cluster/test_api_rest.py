"""REST behaviour of kubesim judged by the official kubernetes client: CRUD, selectors,
status split, patches, paging, errors as Status bodies, deletion propagation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cluster_helpers import seeded_pod, shape
from kubernetes import client
from kubernetes.client.rest import ApiException
from waiting import wait_for


def _body(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


def test_created_pod_gets_server_fields_and_defaults(core: client.CoreV1Api, ns: str) -> None:
    pod = core.create_namespaced_pod(ns, {**seeded_pod("p"), "metadata": {"generateName": "p-"}})
    assert pod.metadata.name.startswith("p-") and len(pod.metadata.name) == 7
    assert pod.metadata.uid and pod.metadata.resource_version and pod.metadata.creation_timestamp
    assert pod.spec.restart_policy == "Always"
    assert pod.spec.termination_grace_period_seconds == 30
    assert pod.spec.containers[0].termination_message_path == "/dev/termination-log"
    assert pod.spec.containers[0].image_pull_policy == "IfNotPresent"
    assert {t.key for t in pod.spec.tolerations} == {"node.kubernetes.io/not-ready",
                                                     "node.kubernetes.io/unreachable"}
    assert pod.status.phase == "Pending" and pod.status.qos_class == "BestEffort"


def test_job_defaults_select_its_pods_by_controller_uid(batch: client.BatchV1Api, ns: str) -> None:
    job = batch.create_namespaced_job(ns, {
        "metadata": {"name": "j"},
        "spec": {"suspend": True, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "python:3.11"}]}}}})
    uid = job.metadata.uid
    assert job.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    assert job.spec.template.metadata.labels["job-name"] == "j"
    assert job.spec.backoff_limit == 6 and job.spec.completion_mode == "NonIndexed"
    assert job.spec.pod_replacement_policy == "TerminatingOrFailed"


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=a", ["a1", "a2"]),
    ("app==a,tier!=web", ["a1"]),
    ("app in (a,b),tier", ["a2", "b1"]),
    ("app notin (a)", ["b1", "c1"]),
    ("!tier", ["a1", "c1"]),
])
def test_label_selectors_filter_lists(core: client.CoreV1Api, ns: str, selector: str,
                                      expected: list[str]) -> None:
    for name, labels in [("a1", {"app": "a"}), ("a2", {"app": "a", "tier": "web"}),
                         ("b1", {"app": "b", "tier": "db"}), ("c1", {"app": "c"})]:
        core.create_namespaced_pod(ns, seeded_pod(name, labels=labels))
    found = core.list_namespaced_pod(ns, label_selector=selector)
    assert [p.metadata.name for p in found.items] == expected


def test_field_selector_on_status_phase_and_unsupported_field(core: client.CoreV1Api,
                                                              ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    assert len(core.list_namespaced_pod(ns, field_selector="status.phase=Pending").items) == 1
    assert core.list_namespaced_pod(ns, field_selector="status.phase!=Pending").items == []
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod(ns, field_selector="spec.containers=x")
    assert err.value.status == 400
    assert _body(err.value)["message"] == "field label not supported: spec.containers"


def test_status_subresource_changes_only_status(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    core.patch_namespaced_pod_status("p", ns, {
        "metadata": {"labels": {"ignored": "yes"}},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "main", "image": "python:3.11", "imageID": "", "ready": True,
            "restartCount": 0, "state": {"running": {"startedAt": "2025-06-01T10:01:00Z"}}}]}})
    pod = core.read_namespaced_pod("p", ns)
    assert pod.status.phase == "Running" and pod.status.container_statuses[0].ready
    assert "ignored" not in (pod.metadata.labels or {})
    core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"kept": "yes"}},
                                        "status": {"phase": "Failed"}})
    pod = core.read_namespaced_pod("p", ns)
    assert pod.metadata.labels["kept"] == "yes" and pod.status.phase == "Running"


def test_stale_resource_version_is_a_conflict(core: client.CoreV1Api, ns: str) -> None:
    created = core.create_namespaced_pod(ns, seeded_pod("p"))
    core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"x": "1"}}})
    created.metadata.labels = {"y": "2"}
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_pod("p", ns, created)
    body = _body(err.value)
    assert err.value.status == 409 and body["reason"] == "Conflict"
    assert body["message"].startswith('Operation cannot be fulfilled on pods "p": the object '
                                      "has been modified")


@pytest.mark.parametrize(("content_type", "patch", "expected"), [
    ("application/merge-patch+json", {"metadata": {"labels": {"a": None, "b": "2"}}},
     {"b": "2", "keep": "1"}),
    ("application/json-patch+json", [{"op": "replace", "path": "/metadata/labels/a",
                                      "value": "9"}], {"a": "9", "keep": "1"}),
    ("application/strategic-merge-patch+json", {"metadata": {"labels": {"c": "3"}}},
     {"a": "1", "c": "3", "keep": "1"}),
])
def test_patch_types_follow_their_rfcs(api_client: client.ApiClient, core: client.CoreV1Api,
                                       ns: str, content_type: str, patch: Any,
                                       expected: dict[str, str]) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p", labels={"a": "1", "keep": "1"}))
    api_client.call_api(f"/api/v1/namespaces/{ns}/pods/p", "PATCH", body=patch,
                        header_params={"Content-Type": content_type,
                                       "Accept": "application/json"},
                        response_types_map={200: "V1Pod"}, auth_settings=["BearerToken"])
    assert core.read_namespaced_pod("p", ns).metadata.labels == expected


def test_strategic_merge_merges_containers_by_name(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p", containers=("a", "b")))
    core.patch_namespaced_pod("p", ns, {"spec": {"containers": [
        {"name": "b", "env": [{"name": "X", "value": "1"}]}]}})
    pod = core.read_namespaced_pod("p", ns)
    assert [c.name for c in pod.spec.containers] == ["a", "b"]
    assert pod.spec.containers[1].env[0].value == "1"


@pytest.mark.parametrize(("call", "status", "reason", "message"), [
    (lambda core, ns: core.read_namespaced_pod("nope", ns), 404, "NotFound",
     'pods "nope" not found'),
    (lambda core, ns: core.create_namespaced_pod(ns, seeded_pod("Bad_Name")), 422, "Invalid",
     'Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a lowercase RFC '
     "1123 subdomain"),
    (lambda core, ns: core.create_namespaced_pod("no-such-ns", seeded_pod("p")), 404,
     "NotFound", 'namespaces "no-such-ns" not found'),
])
def test_errors_are_status_bodies_with_apiserver_messages(core: client.CoreV1Api, ns: str, call: Any,
                                                          status: int, reason: str,
                                                          message: str) -> None:
    with pytest.raises(ApiException) as err:
        call(core, ns)
    body = shape(_body(err.value), "V1Status")
    assert (err.value.status, body.reason, body.code) == (status, reason, status)
    assert body.message.startswith(message)


def test_duplicate_job_name_already_exists(batch: client.BatchV1Api, ns: str) -> None:
    job = {"metadata": {"name": "j"}, "spec": {"suspend": True, "template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "python:3.11"}]}}}}
    batch.create_namespaced_job(ns, job)
    with pytest.raises(ApiException) as err:
        batch.create_namespaced_job(ns, job)
    assert err.value.status == 409
    assert _body(err.value)["message"] == 'jobs.batch "j" already exists'


def test_pod_failure_policy_needs_restart_policy_never(batch: client.BatchV1Api, ns: str) -> None:
    with pytest.raises(ApiException) as err:
        batch.create_namespaced_job(ns, {"metadata": {"name": "j"}, "spec": {
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                "operator": "In", "values": [42]}}]},
            "template": {"spec": {"restartPolicy": "OnFailure",
                                  "containers": [{"name": "c", "image": "python:3.11"}]}}}})
    assert err.value.status == 422
    causes = _body(err.value)["details"]["causes"]
    assert causes[0]["field"] == "spec.template.spec.restartPolicy"


def test_limit_and_continue_page_through_a_list(core: client.CoreV1Api, ns: str) -> None:
    for i in range(5):
        core.create_namespaced_pod(ns, seeded_pod(f"p{i}"))
    first = core.list_namespaced_pod(ns, limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert first.metadata.remaining_item_count == 3
    rest = core.list_namespaced_pod(ns, limit=10, _continue=first.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["p2", "p3", "p4"]
    assert rest.metadata._continue is None


def test_dry_run_validates_without_storing(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"), dry_run="All")
    assert core.list_namespaced_pod(ns).items == []


def _owned_pod(name: str, owner: Any) -> dict[str, Any]:
    pod = seeded_pod(name)
    pod["metadata"]["ownerReferences"] = [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name,
        "uid": owner.metadata.uid, "blockOwnerDeletion": True}]
    return pod


def _owner(core: client.CoreV1Api, ns: str) -> Any:
    # A ConfigMap owner: no controller acts on it, so only the garbage collector moves.
    return core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})


def test_job_delete_without_policy_warns_that_pods_are_orphaned(batch: client.BatchV1Api,
                                                                 ns: str) -> None:
    batch.create_namespaced_job(ns, {"metadata": {"name": "j"}, "spec": {
        "suspend": True, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "python:3.11"}]}}}})
    _, _, headers = batch.delete_namespaced_job_with_http_info("j", ns)
    assert "child pods are preserved by default when jobs are deleted" in headers["Warning"]
    wait_for(lambda: not batch.list_namespaced_job(ns).items, 5, "the deletion to finish")


def test_orphan_delete_keeps_dependents_without_the_owner_reference(core: client.CoreV1Api,
                                                                   ns: str) -> None:
    core.create_namespaced_pod(ns, _owned_pod("child", _owner(core, ns)))
    core.delete_namespaced_config_map("owner", ns, propagation_policy="Orphan")
    wait_for(lambda: not core.list_namespaced_config_map(ns, field_selector="metadata.name=owner")
             .items, 5, "the owner to be deleted")
    assert core.read_namespaced_pod("child", ns).metadata.owner_references is None


@pytest.mark.parametrize("policy", ["Background", "Foreground"])
def test_delete_with_propagation_removes_dependents(core: client.CoreV1Api, ns: str,
                                                   policy: str) -> None:
    core.create_namespaced_pod(ns, _owned_pod("child", _owner(core, ns)))
    core.delete_namespaced_config_map("owner", ns, propagation_policy=policy)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, 5, "the deletion to finish")
    wait_for(lambda: not core.list_namespaced_config_map(ns, field_selector="metadata.name=owner")
             .items, 5, "the owner to be deleted")


def test_foreground_delete_keeps_owner_until_dependents_are_gone(core: client.CoreV1Api,
                                                                 ns: str) -> None:
    pod = _owned_pod("child", _owner(core, ns))
    pod["metadata"]["finalizers"] = ["example.com/hold"]
    core.create_namespaced_pod(ns, pod)
    core.delete_namespaced_config_map("owner", ns, propagation_policy="Foreground")
    # The collector reaches the dependent in its own time: wait for that, not for a fixed delay.
    wait_for(lambda: core.read_namespaced_pod("child", ns).metadata.deletion_timestamp is not None, 5, "the deletion to finish")
    held = core.read_namespaced_config_map("owner", ns)
    assert held.metadata.deletion_timestamp is not None
    assert "foregroundDeletion" in held.metadata.finalizers
    assert core.read_namespaced_pod("child", ns).metadata.deletion_timestamp is not None
    core.patch_namespaced_pod("child", ns, {"metadata": {"finalizers": None}})
    wait_for(lambda: not core.list_namespaced_config_map(ns).items, 5, "the deletion to finish")


def test_deleted_namespace_terminates_empties_and_goes(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
    core.delete_namespace(ns)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, seeded_pod("q"))
    if err.value.status == 403:
        assert "because it is being terminated" in _body(err.value)["message"]
    else:  # already gone: emptying a namespace of seeded objects takes milliseconds
        assert err.value.status == 404
    wait_for(lambda: not core.list_namespace(field_selector=f"metadata.name={ns}").items, 5, "the deletion to finish")
    assert [p.metadata.name for p in core.list_namespaced_pod(ns).items] == []
    assert core.list_namespaced_config_map(ns).items == []


def test_dry_run_delete_changes_nothing(sim: Any, core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, seeded_pod("p"))
    core.delete_namespaced_pod("p", ns, dry_run="All")
    assert core.read_namespaced_pod("p", ns).metadata.deletion_timestamp is None
