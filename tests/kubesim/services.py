"""core/v1 Services: the apiserver's defaults and checks, and which pods back a Service.

What belongs here: Service defaulting (pkg/apis/core/v1/defaults.go and the ClusterIP allocator
of Kubernetes 1.32: type ClusterIP, a cluster IP from 10.96.0.0/12 unless `clusterIP: None`,
sessionAffinity, ipFamilies, port protocol and targetPort), validation with the apiserver's
words, and the endpoint rule the EndpointSlice controller applies (pods selected, not
terminal, ready unless `publishNotReadyAddresses`), which cluster DNS serves.

What does not: the DNS names themselves (dns.py) or routing traffic to cluster IPs: kubesim
has no kube-proxy, so only headless Services reach pods (through their pod IPs).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from typing import Any

Cause = tuple[str, str, str]

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_MSG = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
                "start with an alphabetic character, and end with an alphanumeric character "
                "(e.g. 'my-name',  or 'abc-123', regex used for validation is "
                "'[a-z]([-a-z0-9]*[a-z0-9])?')")
_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")


def _cluster_ip() -> str:
    # The allocator hands out a random free address of the service CIDR (10.96.0.0/12 in kind
    # and kubeadm clusters), skipping the network address and the first (kubernetes) one.
    offset = random.randrange(2, 2**20 - 1)
    return f"10.{96 + (offset >> 16)}.{(offset >> 8) & 0xFF}.{offset & 0xFF}"


def default(service: dict[str, Any]) -> None:
    """Fill a new Service's defaults in place."""
    spec = service.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName":
        if not spec.get("clusterIP"):
            spec["clusterIP"] = (spec.get("clusterIPs") or [None])[0] or _cluster_ip()
        spec["clusterIPs"] = [spec["clusterIP"]]
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    service["status"] = {"loadBalancer": {}}


def causes(service: dict[str, Any]) -> list[Cause]:
    """Why the apiserver would refuse this Service (ValidateService), empty when valid."""
    found: list[Cause] = []
    name = (service.get("metadata") or {}).get("name") or ""
    if name and not _DNS1035.match(name):
        found.append(("FieldValueInvalid", "metadata.name",
                      f'Invalid value: "{name}": {_DNS1035_MSG}'))
    spec = service.get("spec") or {}
    kind = spec.get("type", "ClusterIP")
    if kind not in _TYPES:
        found.append(("FieldValueNotSupported", "spec.type", f'Unsupported value: "{kind}": '
                      'supported values: "ClusterIP", "ExternalName", "LoadBalancer", '
                      '"NodePort"'))
    if kind != "ExternalName" and spec.get("clusterIP") != "None" and not spec.get("ports"):
        found.append(("FieldValueRequired", "spec.ports", "Required value"))
    for i, port in enumerate(spec.get("ports") or []):
        number = port.get("port")
        if not isinstance(number, int) or not 0 < number < 65536:
            found.append(("FieldValueInvalid", f"spec.ports[{i}].port",
                          f"Invalid value: {number}: must be between 1 and 65535, inclusive"))
        if len(spec.get("ports") or []) > 1 and not port.get("name"):
            found.append(("FieldValueRequired", f"spec.ports[{i}].name", "Required value"))
    return found


def update_causes(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """The cluster IP stays what it was allocated (ValidateServiceUpdate)."""
    before = (old.get("spec") or {}).get("clusterIPs") or []
    after = (new.get("spec") or {}).get("clusterIPs") or before
    if before and after != before:
        shown = "[]string{" + ", ".join(f'"{ip}"' for ip in after) + "}"
        return [("FieldValueInvalid", "spec.clusterIPs[0]",
                 f"Invalid value: {shown}: may not change once set")]
    return []


def headless(service: dict[str, Any]) -> bool:
    return (service.get("spec") or {}).get("clusterIP") == "None"


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def endpoints(service: dict[str, Any], pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods a Service's endpoints list (and cluster DNS serves), by name.

    As the EndpointSlice controller decides (ShouldPodBeInEndpoints, podEndpointsChanged): the
    selector matches, the pod has an IP and is not Succeeded or Failed; it is served while
    Ready and not terminating, or always with `publishNotReadyAddresses: true`. A Service
    without a selector has no managed endpoints.
    """
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    if not selector:
        return []
    namespace = service["metadata"].get("namespace")
    everyone = bool(spec.get("publishNotReadyAddresses"))
    chosen = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        labels = meta.get("labels") or {}
        if meta.get("namespace") != namespace or any(labels.get(k) != v
                                                     for k, v in selector.items()):
            continue
        if not status.get("podIP") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        if everyone or (_ready(pod) and not meta.get("deletionTimestamp")):
            chosen.append(pod)
    return sorted(chosen, key=lambda p: p["metadata"]["name"])
