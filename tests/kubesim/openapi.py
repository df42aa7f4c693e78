"""A minimal OpenAPI v3 index, just enough for kubectl create/apply to validate on the server.

kubectl looks for a PATCH operation with a `fieldValidation` query parameter for the object's
kind; finding it, it sends `fieldValidation=Strict` and leaves validation to the server instead
of downloading full schemas. No schemas are published, so client-side schema validation and
`kubectl explain` do not work.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kubesim.resources import RESOURCES, ResourceInfo


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _item_path(res: ResourceInfo) -> str:
    scope = "/namespaces/{namespace}" if res.namespaced else ""
    return f"/{_gv_path(res.group, res.version)}{scope}/{res.plural}/{{name}}"


def group_version_doc(group: str, version: str) -> dict[str, Any] | None:
    """The per-group-version document: PATCH operations that accept fieldValidation."""
    served = [r for r in RESOURCES.values() if r.group == group and r.version == version]
    if not served:
        return None
    paths = {}
    for res in served:
        paths[_item_path(res)] = {"patch": {
            "operationId": f"patch{res.kind}",
            "parameters": [{"name": "fieldValidation", "in": "query",
                            "schema": {"type": "string", "uniqueItems": True}}],
            "responses": {"200": {"description": "OK"}},
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": group, "version": version,
                                                "kind": res.kind}}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.4-kubesim"},
            "paths": paths, "components": {"schemas": {}}}


def _hash(doc: dict[str, Any]) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()


def index() -> dict[str, Any]:
    """GET /openapi/v3: where each group version's document lives."""
    pairs = sorted({(r.group, r.version) for r in RESOURCES.values()})
    paths = {}
    for group, version in pairs:
        doc = group_version_doc(group, version)
        if doc is not None:
            rel = _gv_path(group, version)
            paths[rel] = {"serverRelativeURL": f"/openapi/v3/{rel}?hash={_hash(doc)}"}
    return {"paths": paths}


def lookup(path: str) -> dict[str, Any] | None:
    """The document for /openapi/v3[/api/v1 | /apis/{group}/{version}], or None."""
    parts = [p for p in path.split("/") if p][2:]
    if not parts:
        return index()
    if parts[0] == "api" and len(parts) == 2:
        return group_version_doc("", parts[1])
    if parts[0] == "apis" and len(parts) == 3:
        return group_version_doc(parts[1], parts[2])
    return None
