"""The garbage collector: dependents follow their owners by `ownerReferences[].uid`.

Background: dependents whose owners are all gone are deleted. Foreground: an owner marked
`foregroundDeletion` waits until its dependents are gone. Orphan: the owner's dependents lose
their reference to it, then the owner goes. Terminating namespaces are emptied, then removed.
How a single object is deleted is deletion.py's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubesim.deletion import delete_object
from kubesim.errors import ApiError
from kubesim.resources import RESOURCES
from kubesim.store import Store

log = logging.getLogger(__name__)

# Kinds that own or are owned in this cluster; events are never owners of anything.
OWNED_KINDS = ("jobs", "pods", "configmaps", "secrets", "persistentvolumeclaims", "leases",
               "services", "pytorchjobs")
# Cluster-scoped kinds own namespaced objects too: a Node owns its Lease in kube-node-lease.
CLUSTER_OWNER_KINDS = ("nodes", "namespaces")
_DEBOUNCE_SECONDS = 0.02


def _key(resource: str, obj: dict[str, Any]) -> tuple[str, str | None, str]:
    return resource, obj["metadata"].get("namespace"), obj["metadata"]["name"]


def _dependents(objects: list[tuple[str, dict[str, Any]]],
                uid: str) -> list[tuple[str, dict[str, Any]]]:
    return [(r, o) for r, o in objects
            if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or [])]


def _drop_finalizer(store: Store, resource: str, obj: dict[str, Any], finalizer: str) -> None:
    def strip(o: dict[str, Any]) -> None:
        fins = [f for f in o["metadata"].get("finalizers") or [] if f != finalizer]
        if fins:
            o["metadata"]["finalizers"] = fins
        else:
            o["metadata"].pop("finalizers", None)

    store.mutate(*_key(resource, obj), strip)


def _orphan(store: Store, objects: list[tuple[str, dict[str, Any]]], resource: str,
            owner: dict[str, Any]) -> None:
    uid = owner["metadata"]["uid"]
    for dep_resource, dep in _dependents(objects, uid):
        def unlink(o: dict[str, Any]) -> None:
            refs = [r for r in o["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
            if refs:
                o["metadata"]["ownerReferences"] = refs
            else:
                o["metadata"].pop("ownerReferences", None)

        store.mutate(*_key(dep_resource, dep), unlink)
    _drop_finalizer(store, resource, owner, "orphan")


def _foreground(store: Store, objects: list[tuple[str, dict[str, Any]]], resource: str,
                owner: dict[str, Any]) -> None:
    deps = _dependents(objects, owner["metadata"]["uid"])
    if not deps:
        _drop_finalizer(store, resource, owner, "foregroundDeletion")
        return
    for dep_resource, dep in deps:
        if not dep["metadata"].get("deletionTimestamp"):
            _delete(store, dep_resource, dep, "Foreground")


def _delete(store: Store, resource: str, obj: dict[str, Any], propagation: str) -> None:
    try:
        delete_object(store, *_key(resource, obj), propagation=propagation)
    except ApiError as exc:  # gone meanwhile: nothing left to collect
        log.debug("gc: delete %s/%s: %s", resource, obj["metadata"]["name"], exc.message)


def collect(store: Store) -> None:
    """One pass over all owned kinds; safe to run at any time."""
    objects = [(r, o) for r in OWNED_KINDS for o in store.list(r)]
    owners = objects + [(r, o) for r in CLUSTER_OWNER_KINDS for o in store.list(r)]
    alive = {o["metadata"]["uid"] for _, o in owners}
    for resource, obj in objects:
        meta = obj["metadata"]
        fins = meta.get("finalizers") or []
        if meta.get("deletionTimestamp") and "orphan" in fins:
            _orphan(store, objects, resource, obj)
        elif meta.get("deletionTimestamp") and "foregroundDeletion" in fins:
            _foreground(store, objects, resource, obj)
    for resource, obj in objects:
        refs = obj["metadata"].get("ownerReferences") or []
        if refs and not obj["metadata"].get("deletionTimestamp") and \
                not any(r.get("uid") in alive for r in refs):
            _delete(store, resource, obj, "Background")


def empty_namespaces(store: Store) -> None:
    """Delete the contents of Terminating namespaces; remove each once nothing is left."""
    for ns in store.list("namespaces"):
        if not ns["metadata"].get("deletionTimestamp"):
            continue
        name = ns["metadata"]["name"]
        left = [(r.plural, o) for r in RESOURCES.values() if r.namespaced
                for o in store.list(r.plural, name)]
        for resource, obj in left:
            if not obj["metadata"].get("deletionTimestamp"):
                _delete(store, resource, obj, "Background")
        if not left:
            store.remove("namespaces", None, name)


def _relevant(event_type: str, resource: str, obj: dict[str, Any]) -> bool:
    meta = obj.get("metadata") or {}
    if resource == "namespaces" or (event_type == "DELETED" and (
            meta.get("namespace") or resource in CLUSTER_OWNER_KINDS)):
        return True
    return resource in OWNED_KINDS and (event_type == "DELETED" or bool(
        meta.get("deletionTimestamp") or meta.get("ownerReferences")))


async def run(store: Store) -> None:
    """Collect after every relevant change, batching bursts of changes."""
    queue = store.subscribe()
    try:
        while True:
            event_type, resource, obj = await queue.get()
            if not _relevant(event_type, resource, obj):
                continue
            await asyncio.sleep(_DEBOUNCE_SECONDS)
            while not queue.empty():
                queue.get_nowait()
            collect(store)
            empty_namespaces(store)
    finally:
        store.unsubscribe(queue)
