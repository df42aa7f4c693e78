"""Label and field selectors: parsing and matching, with the apiserver's error texts.

Label selectors follow k8s.io/apimachinery/pkg/labels (`=`, `==`, `!=`, `in`, `notin`, `key`,
`!key`); field selectors support only the fields the real apiserver registers per resource.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kubesim.errors import BadRequest

Matcher = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t for t in terms if t.strip()]


def _label_term(term: str) -> Matcher:
    eq = _EQ_RE.match(term)
    if eq:
        key, op, value = eq.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    match = _SET_RE.match(term)
    if not match:
        raise BadRequest(f"unable to parse requirement: {term.strip()!r}")
    neg, key, op, values = match.groups()
    if op is None:
        if neg:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    allowed = {v.strip() for v in values.split(",") if v.strip()}
    if op == "in":
        return lambda labels: labels.get(key) in allowed
    return lambda labels: labels.get(key) not in allowed


def label_matcher(selector: str | None) -> Matcher:
    """A predicate over an object's labels (the object itself is passed)."""
    if not selector:
        return lambda obj: True
    terms = [_label_term(t) for t in _split_terms(selector)]

    def match(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(t(labels) for t in terms)

    return match


def match_labels(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """Match a structured LabelSelector (matchLabels + matchExpressions); None matches nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        ok = {"In": lambda: labels.get(key) in values,
              "NotIn": lambda: labels.get(key) not in values,
              "Exists": lambda: key in labels,
              "DoesNotExist": lambda: key not in labels}[op]()
        if not ok:
            return False
    return True


def _lookup(obj: dict[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


_COMMON = ("metadata.name", "metadata.namespace")
FIELDS: dict[str, tuple[str, ...]] = {
    "pods": _COMMON + ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                       "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                       "status.podIP", "status.nominatedNodeName"),
    "events": _COMMON + tuple(f"involvedObject.{f}" for f in (
        "kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"))
    + ("reason", "reportingComponent", "source", "type"),
    "jobs": _COMMON + ("status.successful",),
    "nodes": _COMMON + ("spec.unschedulable",),
    "namespaces": _COMMON + ("status.phase",),
    "secrets": _COMMON + ("type",),
    "services": _COMMON + ("spec.clusterIP", "spec.type"),
}


def _field_value(resource: str, obj: dict[str, Any], field: str) -> str:
    if resource == "events" and field == "source":
        return str((obj.get("source") or {}).get("component") or obj.get("reportingComponent")
                   or "")
    if resource == "pods" and field == "spec.hostNetwork":
        return "true" if (obj.get("spec") or {}).get("hostNetwork") else "false"
    if resource == "nodes" and field == "spec.unschedulable":
        return "true" if (obj.get("spec") or {}).get("unschedulable") else "false"
    return _lookup(obj, field)


def field_matcher(resource: str, selector: str | None) -> Matcher:
    """A predicate for a field selector; BadRequest for fields the apiserver doesn't index."""
    if not selector:
        return lambda obj: True
    allowed = FIELDS.get(resource, _COMMON)
    terms: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector):
        match = re.match(r"^\s*([^=!]+?)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not match:
            raise BadRequest(f"invalid selector: '{selector}'; can't understand '{term}'")
        field, op, value = match.groups()
        if field not in allowed:
            raise BadRequest(f"field label not supported: {field}")
        terms.append((field, op == "!=", value))

    def match_obj(obj: dict[str, Any]) -> bool:
        return all((_field_value(resource, obj, f) == v) != neg for f, neg, v in terms)

    return match_obj
