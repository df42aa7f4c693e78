"""Parse an API path and method into what the request is about: resource, namespace, name, verb.

Shared by the REST handlers, the request log and fault matching, so all three agree on what
"a list of pods in namespace x" is. Handling the request does not belong here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kubesim.resources import ResourceInfo, lookup

WATCH_TRUE = {"true", "True", "1", "t", "T", "TRUE"}


@dataclass(frozen=True)
class Target:
    """The resource a request addresses."""

    res: ResourceInfo
    namespace: str | None
    name: str | None
    sub: str | None
    verb: str

    @property
    def resource(self) -> str:
        return self.res.plural


def _verb(method: str, named: bool, query: Mapping[str, str]) -> str:
    if method == "GET":
        if named:
            return "get"
        return "watch" if query.get("watch", "") in WATCH_TRUE else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}.get(method, method.lower())


def _split(path: str) -> tuple[str, str, list[str]] | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        return "", parts[1], parts[2:]
    if len(parts) >= 4 and parts[0] == "apis":
        return parts[1], parts[2], parts[3:]
    return None


def parse(method: str, path: str, query: Mapping[str, str]) -> Target | None:
    """The Target of an API path, or None when the path names no served resource."""
    split = _split(path)
    if split is None:
        return None
    group, version, rest = split
    namespace: str | None = None
    # /api/v1/namespaces/{ns}/{resource}... versus the namespaces resource itself.
    if rest[0] == "namespaces" and len(rest) >= 3 and lookup(group, version, rest[2]):
        namespace, rest = rest[1], rest[2:]
    res = lookup(group, version, rest[0])
    if res is None and group == "" and rest[0] == "namespaces":
        res = lookup("", "v1", "namespaces")
    if res is None or len(rest) > 3:
        return None
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else None
    if sub is not None and sub not in res.subresources:
        return None
    verb = _verb(method, name is not None, query)
    if sub in ("log",):
        verb = "get"
    return Target(res, namespace if res.namespaced else None, name, sub, verb)
