"""Services, pod IPs and pod DNS names, against the documented Kubernetes behaviour.

Oracles: the Service API reference (defaults, headless `clusterIP: None`, immutable cluster IP),
"DNS for Services and Pods" (a pod with `hostname` and `subdomain` matching a headless Service
in its namespace gets `<hostname>.<subdomain>.<ns>.svc.cluster.local`; records exist for ready
pods unless `publishNotReadyAddresses`), "Pod hostname" (HOSTNAME is the pod's hostname), the
garbage collector (a Service owned by a Job goes with it) and kubectl as an independent judge.
Names are resolved by real processes inside the pods, through the system resolver.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
from cluster_helpers import kubectl, read_log, shape
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from waiting import wait_for

import kubesim

IMAGE = "python:3.11"
# Prints what the pod's own resolver answers for each name given, as JSON.
RESOLVE = ("import json, os, socket, sys\n"
           "def lookup(name):\n"
           "    try:\n"
           "        return sorted({a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET)})\n"
           "    except OSError:\n"
           "        return None\n"
           "print(json.dumps({'hostname': socket.gethostname(), 'fqdn': socket.getfqdn(),\n"
           "                  'env': os.environ.get('HOSTNAME'),\n"
           "                  'names': {n: lookup(n) for n in sys.argv[1:]}}), flush=True)\n")


def service(name: str, selector: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"clusterIP": "None", "selector": selector, **spec}}


def pod(name: str, args: list[str], *, labels: dict[str, str] | None = None,
        code: str = RESOLVE, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, **spec,
                     "containers": [{"name": "main", "image": IMAGE,
                                     "command": ["python", "-c", code, *args]}]}}


SLEEPER = "import time; time.sleep(120)"


@pytest.fixture(autouse=True)
def _stop_pods(core: client.CoreV1Api, ns: str) -> Any:
    """Sleeping pods would outlive the test by minutes: they go with it."""
    yield
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)


def phase(core: client.CoreV1Api, ns: str, name: str, wanted: str) -> client.V1Pod | None:
    found = core.read_namespaced_pod(name, ns)
    return found if found.status.phase == wanted else None


def report(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any]:
    wait_for(lambda: phase(core, ns, name, "Succeeded"), what=f"{name} Succeeded")
    return dict(json.loads(read_log(core, name, ns)))


def test_a_headless_service_is_stored_with_the_apiservers_defaults(
        core: client.CoreV1Api, ns: str) -> None:
    created = core.create_namespaced_service(ns, service(
        "trainers", {"app": "train"}, publishNotReadyAddresses=True,
        ports=[{"name": "c10d", "port": 29500}]))
    raw = json.loads(core.read_namespaced_service("trainers", ns, _preload_content=False).data)
    assert shape(raw, "V1Service").spec.cluster_ip == "None"
    spec = raw["spec"]
    assert (spec["clusterIP"], spec["clusterIPs"], spec["type"]) == ("None", ["None"],
                                                                     "ClusterIP")
    assert spec["sessionAffinity"] == "None" and spec["publishNotReadyAddresses"] is True
    assert spec["ports"] == [{"name": "c10d", "port": 29500, "protocol": "TCP",
                              "targetPort": 29500}]
    assert created.metadata.uid and raw["status"] == {"loadBalancer": {}}


def test_a_service_gets_a_cluster_ip_from_the_service_range_that_may_not_change(
        core: client.CoreV1Api, ns: str) -> None:
    created = core.create_namespaced_service(ns, {
        "metadata": {"name": "api"}, "spec": {"selector": {"app": "api"},
                                              "ports": [{"port": 80}]}})
    assert ipaddress.ip_address(created.spec.cluster_ip) in ipaddress.ip_network("10.96.0.0/12")
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_service("api", ns, {"spec": {"clusterIP": "10.96.0.99",
                                                           "clusterIPs": ["10.96.0.99"]}})
    body = json.loads(refused.value.body)
    assert (refused.value.status, body["reason"]) == (422, "Invalid")
    assert "spec.clusterIPs[0]: Invalid value: []string{\"10.96.0.99\"}: may not change once " \
           "set" in body["message"]


@pytest.mark.parametrize(("name", "spec", "field"), [
    ("Trainers", {"clusterIP": "None"}, "metadata.name"),  # a DNS-1035 label
    ("1st", {"clusterIP": "None"}, "metadata.name"),
    ("api", {"selector": {"app": "x"}}, "spec.ports"),  # only headless Services may omit ports
])
def test_invalid_services_are_refused_with_422_naming_the_field(
        core: client.CoreV1Api, ns: str, name: str, spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_service(ns, {"metadata": {"name": name}, "spec": spec})
    body = json.loads(refused.value.body)
    assert refused.value.status == 422
    assert [c["field"] for c in body["details"]["causes"]] == [field]


def test_services_list_by_label_selector_and_watch_reports_their_changes(
        core: client.CoreV1Api, ns: str) -> None:
    first = core.create_namespaced_service(ns, {**service("a", {"x": "1"}),
                                                "metadata": {"name": "a", "labels": {"t": "1"}}})
    core.create_namespaced_service(ns, service("b", {"x": "2"}))
    listed = core.list_namespaced_service(ns, label_selector="t=1").items
    assert [s.metadata.name for s in listed] == ["a"]
    assert core.list_namespaced_service(ns, field_selector="spec.clusterIP=None").items
    core.delete_namespaced_service("a", ns)
    seen = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_service, ns, resource_version=first.metadata.resource_version,
        timeout_seconds=2)]
    assert ("ADDED", "b") in seen and ("DELETED", "a") in seen


def test_kubectl_get_svc_prints_type_cluster_ip_ports_and_selector(
        sim: kubesim.fixture.Sim, core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_service(ns, service("workers", {"job": "w"},
                                               ports=[{"name": "c10d", "port": 29500}]))
    out = kubectl(sim, "get", "svc", "-n", ns, "-o", "wide").stdout.splitlines()
    assert out[0].split() == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE",
                              "SELECTOR"]
    row = out[1].split()
    assert row[:5] == ["workers", "ClusterIP", "None", "<none>", "29500/TCP"]
    assert row[-1] == "job=w"


def test_a_service_owned_by_a_job_is_deleted_with_it_by_the_garbage_collector(
        core: client.CoreV1Api, batch: client.BatchV1Api, ns: str) -> None:
    owner = batch.create_namespaced_job(ns, {"metadata": {"name": "attempt"}, "spec": {
        "suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": IMAGE, "command": ["python", "-c", "pass"]}]}}}})
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "attempt",
           "uid": owner.metadata.uid, "controller": True, "blockOwnerDeletion": True}
    core.create_namespaced_service(ns, {**service("attempt", {"job": "attempt"}), "metadata": {
        "name": "attempt", "ownerReferences": [ref]}})
    batch.delete_namespaced_job("attempt", ns, propagation_policy="Background")
    wait_for(lambda: not core.list_namespaced_service(ns).items, what="the Service collected")


def test_each_running_pod_has_its_own_loopback_ip_which_its_processes_can_bind(
        core: client.CoreV1Api, ns: str) -> None:
    binder = ("import os, socket\ns = socket.socket()\ns.bind((os.environ['POD_IP'], 0))\n"
              "print('bound', s.getsockname()[0], flush=True)\nimport time; time.sleep(120)")
    ip_env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    for name in ("p0", "p1", "p2"):
        spec = pod(name, [], code=binder)
        spec["spec"]["containers"][0]["env"] = ip_env
        core.create_namespaced_pod(ns, spec)
    pods = [wait_for(lambda n=n: phase(core, ns, n, "Running"), what=f"{n} Running")
            for n in ("p0", "p1", "p2")]
    ips = [p.status.pod_ip for p in pods]
    assert len(set(ips)) == 3
    for found, ip in zip(pods, ips, strict=True):
        assert ipaddress.ip_address(ip) in ipaddress.ip_network("127.0.0.0/8")
        assert [i.ip for i in found.status.pod_ips] == [ip]
        assert wait_for(lambda n=found.metadata.name: read_log(core, n, ns),
                        what="the bind report") == f"bound {ip}\n"


def test_pods_resolve_each_other_by_hostname_and_subdomain_of_a_headless_service(
        core: client.CoreV1Api, ns: str) -> None:
    """DNS for Services and Pods: `<hostname>.<subdomain>` in the namespace, the longer forms
    from anywhere; the pod's own hostname and FQDN come from its hosts file."""
    core.create_namespaced_service(ns, service("grp", {"group": "g"}))
    core.create_namespaced_pod(ns, pod("b", [], code=SLEEPER, labels={"group": "g"},
                                       hostname="b", subdomain="grp"))
    b_ip = wait_for(lambda: phase(core, ns, "b", "Running"), what="b Running").status.pod_ip
    names = ["b.grp", f"b.grp.{ns}", f"b.grp.{ns}.svc", f"b.grp.{ns}.svc.cluster.local", "grp",
             "missing.grp"]
    core.create_namespaced_pod(ns, pod("a", names, labels={"group": "g"}, hostname="a",
                                       subdomain="grp"))
    seen = report(core, ns, "a")
    assert seen["names"] == {**{n: [b_ip] for n in names[:4]}, "grp": seen["names"]["grp"],
                             "missing.grp": None}
    assert b_ip in seen["names"]["grp"]  # the Service name answers every ready endpoint
    assert (seen["hostname"], seen["env"]) == ("a", "a")
    assert seen["fqdn"] == f"a.grp.{ns}.svc.cluster.local"


def test_pod_names_resolve_from_other_namespaces_only_in_their_qualified_forms(
        core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_service(ns, service("grp", {"group": "g"}))
    core.create_namespaced_pod(ns, pod("b", [], code=SLEEPER, labels={"group": "g"},
                                       hostname="b", subdomain="grp"))
    b_ip = wait_for(lambda: phase(core, ns, "b", "Running"), what="b Running").status.pod_ip
    other = f"{ns}-other"
    core.create_namespace({"metadata": {"name": other}})
    core.create_namespaced_pod(other, pod("c", ["b.grp", f"b.grp.{ns}", f"b.grp.{ns}.svc"]))
    assert report(core, other, "c")["names"] == {"b.grp": None, f"b.grp.{ns}": [b_ip],
                                                 f"b.grp.{ns}.svc": [b_ip]}


def test_not_ready_pods_resolve_only_through_services_publishing_not_ready_addresses(
        core: client.CoreV1Api, ns: str) -> None:
    """A pod still in its init container has an IP but is not Ready."""
    core.create_namespaced_service(ns, service("open", {"w": "1"}, publishNotReadyAddresses=True))
    core.create_namespaced_service(ns, service("closed", {"w": "1"}))
    waiting = pod("w", [], code=SLEEPER, labels={"w": "1"}, hostname="w", subdomain="open")
    waiting["spec"]["initContainers"] = [{"name": "wait", "image": IMAGE,
                                          "command": ["python", "-c", SLEEPER]}]
    core.create_namespaced_pod(ns, waiting)
    w_ip = wait_for(lambda: core.read_namespaced_pod("w", ns).status.pod_ip, what="w's pod IP")
    core.create_namespaced_pod(ns, pod("probe", ["w.open", "open", "closed"]))
    assert report(core, ns, "probe")["names"] == {"w.open": [w_ip], "open": [w_ip],
                                                  "closed": None}
