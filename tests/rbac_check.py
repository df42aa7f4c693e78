"""What `deployments/kubernetes/rbac.yaml` grants the flow's service account, and what a test made.

Every Kubernetes test that checks the code against the RBAC file uses these two: `allowed_by_rbac`
reads the file as the API server's authorizer would (bindings to `trainguard/trainguard`, their
Roles and ClusterRoles), `calls` reads kubesim's request log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

RBAC = Path(__file__).resolve().parents[1] / "deployments" / "kubernetes" / "rbac.yaml"


def allowed_by_rbac(namespace: str) -> set[tuple[str | None, str, str]]:
    """(namespace or None for cluster scope, resource, verb) the RBAC grants; `trainguard` stands for `namespace`."""
    docs = [doc for doc in yaml.safe_load_all(RBAC.read_text()) if doc]
    bound = {(d["metadata"].get("namespace"), d["roleRef"]["kind"], d["roleRef"]["name"]) for d in docs
             if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and {"kind": "ServiceAccount", "name": "trainguard", "namespace": "trainguard"} in d["subjects"]}
    allowed = set()
    for doc in docs:
        where = doc["metadata"].get("namespace")
        if doc["kind"] in ("Role", "ClusterRole") and (where, doc["kind"], doc["metadata"]["name"]) in bound:
            scope = None if where is None else namespace if where == "trainguard" else where
            allowed |= {(scope, resource, verb) for rule in doc["rules"]
                        for resource in rule["resources"] for verb in rule["verbs"]}
    return allowed


def calls(sim: Any, namespace: str) -> set[tuple[str | None, str, str]]:
    """Every (namespace, resource, verb) requested of the API: the attempt's namespace, `default`, cluster scope."""
    made = set()
    for entry in sim.requests():
        if entry.get("namespace") in (namespace, "default", None) and entry.get("resource") \
                and entry["resource"] != "namespaces":
            resource = entry["resource"] + (f"/{entry['subresource']}" if entry.get("subresource") else "")
            made.add((entry.get("namespace"), resource, entry["verb"]))
    return made
