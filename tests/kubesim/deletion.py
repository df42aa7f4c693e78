"""Deleting objects the way the apiserver does: grace periods, finalizers, propagation policies.

Used by the DELETE and eviction handlers and by the garbage collector; controllers may call
`delete_object` too. Finding and deleting dependents is the garbage collector's job (gc.py).
"""

from __future__ import annotations

import time
from typing import Any

from kubesim.errors import Conflict, NotFound
from kubesim.resources import info
from kubesim.store import Store, timestamp

JOB_ORPHAN_WARNING = ('299 - "child pods are preserved by default when jobs are deleted; set '
                      'propagationPolicy=Background to remove them or set '
                      'propagationPolicy=Orphan to suppress this warning"')
_POLICY_FINALIZERS = {"Orphan": "orphan", "Foreground": "foregroundDeletion"}


def success_status(resource: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The Status an immediate delete answers with."""
    res = info(resource)
    details: dict[str, Any] = {"name": obj["metadata"]["name"], "kind": resource,
                               "uid": obj["metadata"]["uid"]}
    if res.group:
        details["group"] = res.group
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": details}


def delete_object(store: Store, resource: str, namespace: str | None, name: str, *,
                  propagation: str | None = None, grace: int | None = None,
                  uid: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """Delete or start deleting an object.

    Returns the response body (the object while it lingers, else a Success Status; pods always
    answer with the pod) and the Warning headers to send.
    """
    obj = store.get(resource, namespace, name)
    if obj is None:
        raise NotFound.of(resource, name)
    if uid and obj["metadata"]["uid"] != uid:
        raise Conflict(f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                       f"{obj['metadata']['uid']}")
    if resource == "pods":
        return _delete_pod(store, obj, grace), []
    if resource == "namespaces":
        return _delete_namespace(store, obj), []
    warnings: list[str] = []
    if propagation is None:
        propagation = "Orphan" if resource == "jobs" else "Background"
        if resource == "jobs":
            warnings.append(JOB_ORPHAN_WARNING)
    finalizer = _POLICY_FINALIZERS.get(propagation)
    if finalizer is None and not obj["metadata"].get("finalizers"):
        gone = store.remove(resource, namespace, name) or obj
        return success_status(resource, gone), warnings

    def mark(o: dict[str, Any]) -> None:
        meta = o["metadata"]
        meta.setdefault("deletionTimestamp", timestamp())
        meta["deletionGracePeriodSeconds"] = 0
        if finalizer and finalizer not in meta.setdefault("finalizers", []):
            meta["finalizers"].append(finalizer)

    marked = store.mutate(resource, namespace, name, mark)
    return (marked if marked is not None else success_status(resource, obj)), warnings


def _delete_namespace(store: Store, ns: dict[str, Any]) -> dict[str, Any]:
    """Mark it Terminating; the garbage collector empties it and then removes it."""
    def mark(o: dict[str, Any]) -> None:
        o["metadata"].setdefault("deletionTimestamp", timestamp())
        o["metadata"]["deletionGracePeriodSeconds"] = 0
        o.setdefault("status", {})["phase"] = "Terminating"

    return store.mutate("namespaces", None, ns["metadata"]["name"], mark) or ns


def _delete_pod(store: Store, pod: dict[str, Any], grace: int | None) -> dict[str, Any]:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    if grace is None:
        grace = int(spec.get("terminationGracePeriodSeconds", 30))
    # An unscheduled pod has no kubelet to wait for; a bound one is removed by its kubelet.
    if not spec.get("nodeName") or grace <= 0:
        grace = 0
    if grace == 0 and not meta.get("finalizers"):
        return store.remove("pods", meta["namespace"], meta["name"]) or pod
    current = meta.get("deletionGracePeriodSeconds")
    if current is not None and current <= grace:
        return pod  # a second delete may only shorten the grace period

    def mark(o: dict[str, Any]) -> None:
        o["metadata"]["deletionTimestamp"] = timestamp(time.time() + grace)
        o["metadata"]["deletionGracePeriodSeconds"] = grace

    return store.mutate("pods", meta["namespace"], meta["name"], mark) or pod

