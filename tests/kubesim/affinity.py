"""Affinity rules the scheduler filters and scores nodes by.

What belongs here: required node affinity (nodeSelectorTerms ORed, each term's matchExpressions
and matchFields ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt), and inter-pod anti-affinity as
the InterPodAffinity plugin of Kubernetes 1.32 decides it: the incoming pod's required terms
against pods already on nodes of the same topology domain (`node(s) didn't match pod
anti-affinity rules`), existing pods' required terms against the incoming pod (`node(s) didn't
satisfy existing pods anti-affinity rules`), and preferred terms as a score (each matching pod
in the node's domain costs the term's weight).

What does not: the order of filters, messages about resources, binding (scheduler.py).
Not emulated: required pod affinity, namespaceSelector other than `{}` (all namespaces),
matchLabelKeys/mismatchLabelKeys.
"""

from __future__ import annotations

from typing import Any

from kubesim import selectors

ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"


def node_affinity_fits(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution of the pod's nodeAffinity."""
    required = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    return not terms or any(
        (term.get("matchExpressions") or term.get("matchFields"))
        and all(_expression_fits(e, labels) for e in term.get("matchExpressions") or [])
        and all(_expression_fits(e, fields) for e in term.get("matchFields") or [])
        for term in terms)


def _expression_fits(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    present, value = key in labels, labels.get(key)
    if operator in ("Gt", "Lt"):
        try:
            number, bound = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return number > bound if operator == "Gt" else number < bound
    return {"In": present and value in values, "NotIn": not present or value not in values,
            "Exists": present, "DoesNotExist": not present}.get(operator, False)


def _anti(pod: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    anti = ((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}
    return list(anti.get(kind) or [])


def _term_selects(term: dict[str, Any], owner_namespace: str, other: dict[str, Any]) -> bool:
    """Whether a pod (anti-)affinity term of a pod in owner_namespace selects `other`."""
    namespace = other["metadata"].get("namespace")
    listed = term.get("namespaces") or []
    every = term.get("namespaceSelector") == {}
    if not every and namespace not in (listed or [owner_namespace]):
        return False
    return selectors.match_labels(term.get("labelSelector"),
                                  other["metadata"].get("labels") or {})


def _same_domain(key: str, node: dict[str, Any], other: dict[str, Any] | None) -> bool:
    mine = (node["metadata"].get("labels") or {}).get(key)
    theirs = ((other or {}).get("metadata", {}).get("labels") or {}).get(key)
    return mine is not None and mine == theirs


def _placed(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def anti_affinity_failure(pod: dict[str, Any], node: dict[str, Any], pods: list[dict[str, Any]],
                          nodes: dict[str, dict[str, Any]]) -> str | None:
    """The InterPodAffinity filter's reason against this node, or None when it passes."""
    namespace = pod["metadata"].get("namespace", "")
    placed = _placed(pods)
    for term in _anti(pod, "requiredDuringSchedulingIgnoredDuringExecution"):
        key = term.get("topologyKey", "")
        if any(_term_selects(term, namespace, other)
               and _same_domain(key, node, nodes.get(other["spec"]["nodeName"]))
               for other in placed):
            return ANTI_AFFINITY
    for other in placed:
        for term in _anti(other, "requiredDuringSchedulingIgnoredDuringExecution"):
            if _term_selects(term, other["metadata"].get("namespace", ""), pod) and _same_domain(
                    term.get("topologyKey", ""), node, nodes.get(other["spec"]["nodeName"])):
                return EXISTING_ANTI_AFFINITY
    return None


def preference(pod: dict[str, Any], node: dict[str, Any], pods: list[dict[str, Any]],
               nodes: dict[str, dict[str, Any]]) -> int:
    """The InterPodAffinity score of a node from preferred anti-affinity (higher is better)."""
    namespace, score = pod["metadata"].get("namespace", ""), 0
    for other in _placed(pods):
        where = nodes.get(other["spec"]["nodeName"])
        for weighted in _anti(pod, "preferredDuringSchedulingIgnoredDuringExecution"):
            term = weighted.get("podAffinityTerm") or {}
            if _term_selects(term, namespace, other) and _same_domain(
                    term.get("topologyKey", ""), node, where):
                score -= int(weighted.get("weight", 1))
        for weighted in _anti(other, "preferredDuringSchedulingIgnoredDuringExecution"):
            term = weighted.get("podAffinityTerm") or {}
            if _term_selects(term, other["metadata"].get("namespace", ""), pod) and _same_domain(
                    term.get("topologyKey", ""), node, where):
                score -= int(weighted.get("weight", 1))
    return score
