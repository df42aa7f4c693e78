"""Discovery documents: /version, /api, /apis and the per-group resource lists kubectl reads.

Shapes as kubectl 1.32 accepts them (groupVersion "v1" for core). Which resources exist is
resources.py's; this module only renders them.
"""

from __future__ import annotations

from typing import Any

from kubesim.resources import ALL_VERBS, GROUPS, RESOURCES, ResourceInfo

VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.4-kubesim",
           "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
           "buildDate": "2025-04-22T00:00:00Z", "goVersion": "go1.23.6", "compiler": "gc",
           "platform": "linux/amd64"}

_SUB_VERBS = {"status": ["get", "patch", "update"], "log": ["get"], "eviction": ["create"]}


def api_versions(address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}


def _group(name: str, version: str) -> dict[str, Any]:
    gv = {"groupVersion": f"{name}/{version}", "version": version}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


def group_list() -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group(g, v) for g, v in GROUPS.items()]}


def group(name: str) -> dict[str, Any] | None:
    if name not in GROUPS:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, GROUPS[name])}


def _entries(res: ResourceInfo) -> list[dict[str, Any]]:
    main = {"name": res.plural, "singularName": res.singular, "namespaced": res.namespaced,
            "kind": res.kind, "verbs": list(res.verbs or ALL_VERBS)}
    if res.short_names:
        main["shortNames"] = list(res.short_names)
    if res.categories:
        main["categories"] = list(res.categories)
    entries = [main]
    for sub in res.subresources:
        entry = {"name": f"{res.plural}/{sub}", "singularName": "", "namespaced": res.namespaced,
                 "kind": res.kind, "verbs": _SUB_VERBS[sub]}
        if sub == "eviction":
            entry.update(group="policy", version="v1", kind="Eviction")
        entries.append(entry)
    return entries


def resource_list(group_name: str, version: str) -> dict[str, Any] | None:
    """APIResourceList for /api/v1 (group "") or /apis/{group}/{version}."""
    if group_name and GROUPS.get(group_name) != version:
        return None
    if not group_name and version != "v1":
        return None
    entries = [e for r in RESOURCES.values() if r.group == group_name and r.version == version
               for e in _entries(r)]
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group_name}/{version}" if group_name else version,
            "resources": entries}
