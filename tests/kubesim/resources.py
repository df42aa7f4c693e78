"""The resource kinds kubesim serves: names, groups, scope and verbs.

One table that the store (error messages, list kinds), the REST router and discovery share.
Behaviour of the resources (defaults, validation, controllers) does not belong here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceInfo:
    """How one resource is named and scoped on the wire."""

    plural: str
    singular: str
    kind: str
    group: str = ""
    version: str = "v1"
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    verbs: tuple[str, ...] = field(default=ALL_VERBS)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The name the apiserver uses in messages: `pods`, `jobs.batch`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES: dict[str, ResourceInfo] = {
    r.plural: r
    for r in (
        ResourceInfo("pods", "pod", "Pod", short_names=("po",), categories=("all",),
                     subresources=("status", "log", "eviction")),
        ResourceInfo("events", "event", "Event", short_names=("ev",)),
        ResourceInfo("nodes", "node", "Node", namespaced=False, short_names=("no",),
                     subresources=("status",)),
        ResourceInfo("namespaces", "namespace", "Namespace", namespaced=False,
                     short_names=("ns",), subresources=("status",)),
        ResourceInfo("secrets", "secret", "Secret"),
        ResourceInfo("configmaps", "configmap", "ConfigMap", short_names=("cm",)),
        ResourceInfo("serviceaccounts", "serviceaccount", "ServiceAccount",
                     short_names=("sa",)),
        ResourceInfo("persistentvolumeclaims", "persistentvolumeclaim",
                     "PersistentVolumeClaim", short_names=("pvc",), subresources=("status",)),
        ResourceInfo("jobs", "job", "Job", group="batch", categories=("all",),
                     subresources=("status",)),
        ResourceInfo("services", "service", "Service", short_names=("svc",),
                     categories=("all",), subresources=("status",)),
        ResourceInfo("leases", "lease", "Lease", group="coordination.k8s.io"),
        # RBAC objects are kept and served (so `kubectl apply -k deployments/kubernetes` works);
        # kubesim authorizes nothing with them: every request is allowed.
        ResourceInfo("roles", "role", "Role", group="rbac.authorization.k8s.io"),
        ResourceInfo("rolebindings", "rolebinding", "RoleBinding",
                     group="rbac.authorization.k8s.io"),
        ResourceInfo("clusterroles", "clusterrole", "ClusterRole",
                     group="rbac.authorization.k8s.io", namespaced=False),
        ResourceInfo("clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding",
                     group="rbac.authorization.k8s.io", namespaced=False),
        # The Kubeflow training operator's CRD (kubeflow.org_pytorchjobs.yaml, v1.9).
        ResourceInfo("pytorchjobs", "pytorchjob", "PyTorchJob", group="kubeflow.org",
                     subresources=("status",)),
    )
}

# Group/version pairs served under /apis, in discovery order.
GROUPS: dict[str, str] = {"batch": "v1", "coordination.k8s.io": "v1",
                          "rbac.authorization.k8s.io": "v1", "kubeflow.org": "v1"}


def info(resource: str) -> ResourceInfo:
    """The ResourceInfo for a plural name; KeyError names the unknown resource."""
    return RESOURCES[resource]


def lookup(group: str, version: str, plural: str) -> ResourceInfo | None:
    """The resource served at /api(s)/{group}/{version}/{plural}, or None."""
    found = RESOURCES.get(plural)
    if found is None or found.group != group or found.version != version:
        return None
    return found
