"""The one in-memory object store: resourceVersions, change history and watch fan-out.

Every change of cluster state, from the REST layer or from a controller, goes through a
`Store` method, so each one bumps the global resourceVersion and reaches every subscriber.
Admission (defaults, validation), HTTP and controller logic do not belong here.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from kubesim import selectors
from kubesim.errors import AlreadyExists, ApiError, BadRequest, Conflict, Invalid, NotFound
from kubesim.resources import info

__all__ = ["AlreadyExists", "ApiError", "BadRequest", "Conflict", "Invalid", "NotFound",
           "ResourceKey", "Store", "timestamp"]

ResourceKey = tuple[str, str | None, str]
Change = tuple[str, str, dict[str, Any]]  # (event_type, resource, obj)

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
# Kinds whose spec changes bump metadata.generation (pods only gained it in 1.33).
_GENERATION_KINDS = {"jobs", "nodes", "persistentvolumeclaims", "pytorchjobs"}


def timestamp(at: float | None = None) -> str:
    """RFC 3339 with seconds, as metav1.Time serialises."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _suffix(n: int = 5) -> str:
    raw = uuid.uuid4().int
    return "".join(_NAME_CHARS[(raw >> (5 * i)) % len(_NAME_CHARS)] for i in range(n))


def _body(obj: dict[str, Any]) -> dict[str, Any]:
    """Everything but metadata and status: what a generation tracks."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


class Store:
    """All objects of the simulated cluster, keyed by (resource, namespace, name)."""

    def __init__(self, history: int = 10000) -> None:
        self._objects: dict[ResourceKey, dict[str, Any]] = {}
        self._rv = 1000
        self._history: deque[tuple[int, str, str, dict[str, Any]]] = deque(maxlen=history)
        self._subscribers: list[asyncio.Queue[Change]] = []
        self._event_index: dict[tuple[Any, ...], ResourceKey] = {}

    # -- reading -----------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self._rv)

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A deep copy of the object, or None."""
        found = self._objects.get((resource, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def peek(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The stored object itself, or None: for read-only checks on hot paths; never change it."""
        return self._objects.get((resource, namespace, name))

    def view(self, resource: str, namespace: str | None = None
             ) -> builtins.list[dict[str, Any]]:
        """The stored objects themselves, unsorted: for read-only scans by controllers that run
        on every change (a deep copy of every pod each time would cost a good part of a core)."""
        return [o for k, o in self._objects.items()
                if k[0] == resource and (namespace is None or k[1] == namespace)]

    def list(self, resource: str, namespace: str | None = None, *,
             label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict[str, Any]]:
        """Deep copies of matching objects, sorted by namespace/name like etcd keys."""
        by_label = selectors.label_matcher(label_selector)
        by_field = selectors.field_matcher(resource, field_selector)
        keys = sorted((k for k in self._objects if k[0] == resource
                       and (namespace is None or k[1] == namespace)),
                      key=lambda k: (k[1] or "", k[2]))
        found = (self._objects[k] for k in keys)
        return [copy.deepcopy(o) for o in found if by_label(o) and by_field(o)]

    # -- writing -----------------------------------------------------------------------------

    def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object, filling the server-owned metadata; AlreadyExists if taken."""
        res = info(resource)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + _suffix()
        if not meta.get("name"):
            raise Invalid.of(resource, "", [("FieldValueRequired", "metadata.name",
                                              "name or generateName is required")])
        namespace = meta.get("namespace") if res.namespaced else None
        if res.namespaced and not namespace:
            namespace = meta["namespace"] = "default"
        key = (resource, namespace, meta["name"])
        if key in self._objects:
            raise AlreadyExists.of(resource, meta["name"])
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta.setdefault("uid", str(uuid.uuid4()))  # admission may pre-assign it (Job selectors)
        meta.setdefault("creationTimestamp", timestamp())
        if resource in _GENERATION_KINDS:
            meta["generation"] = 1
        for transient in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(transient, None)
        return self._store(key, obj, "ADDED")

    def update(self, resource: str, obj: dict[str, Any], *, subresource: str | None = None,
               check_rv: bool = True) -> dict[str, Any]:
        """Replace an object; with subresource="status" only its status changes.

        Raises Conflict when check_rv and obj carries a stale metadata.resourceVersion.
        """
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") if info(resource).namespaced else None
        if info(resource).namespaced and not namespace:
            namespace = "default"
        key = (resource, namespace, meta.get("name", ""))
        old = self._objects.get(key)
        if old is None:
            raise NotFound.of(resource, key[2])
        wanted_rv = meta.get("resourceVersion")
        if check_rv and wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
            raise Conflict.of(resource, key[2])
        if subresource == "status":
            new = copy.deepcopy(old)
            new["status"] = copy.deepcopy(obj.get("status"))
            if new["status"] is None:
                new.pop("status")
        else:
            new = self._carry_server_fields(resource, old, copy.deepcopy(obj))
        return self._replace(key, old, new)

    def mutate(self, resource: str, namespace: str | None, name: str,
               fn: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
        """Apply fn to a copy of the object and store the result; None if it is gone."""
        key = (resource, namespace if info(resource).namespaced else None, name)
        old = self._objects.get(key)
        if old is None:
            return None
        new = copy.deepcopy(old)
        fn(new)
        new = self._carry_server_fields(resource, old, new)
        return self._replace(key, old, new)

    def remove(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Remove the object now (finalizers notwithstanding); returns its last state."""
        key = (resource, namespace if info(resource).namespaced else None, name)
        old = self._objects.pop(key, None)
        if old is None:
            return None
        self._rv += 1
        old["metadata"]["resourceVersion"] = str(self._rv)
        self._emit("DELETED", resource, old)
        return copy.deepcopy(old)

    # -- watching ----------------------------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[Change]:
        """A queue receiving (event_type, resource, obj) for every later change.

        The obj is shared between subscribers: copy it before changing it.
        """
        queue: asyncio.Queue[Change] = asyncio.Queue()
        self._subscribers.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Change]) -> None:
        """Stop delivering to a queue from subscribe()."""
        if queue in self._subscribers:
            self._subscribers.remove(queue)

    def history_since(self, rv: int
                      ) -> builtins.list[tuple[int, str, str, dict[str, Any]]] | None:
        """Changes after rv, oldest first; None if rv is older than the history kept."""
        if rv >= self._rv:
            return []
        if not self._history or self._history[0][0] > rv + 1:
            return None
        return [h for h in self._history if h[0] > rv]

    def compact(self) -> None:
        """Forget all history, so any older resourceVersion is expired (a fault)."""
        self._history.clear()

    # -- events ------------------------------------------------------------------------------

    def record_event(self, involved: dict[str, Any], reason: str, message: str, *,
                     type: str = "Normal", component: str, host: str | None = None,
                     field_path: str | None = None) -> dict[str, Any]:
        """Create a core/v1 Event about `involved`, or bump count/lastTimestamp of its twin."""
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        ref = {k: v for k, v in {
            "apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
            "name": meta.get("name"), "namespace": meta.get("namespace"),
            "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
            "fieldPath": field_path}.items() if v is not None}
        agg = (namespace, meta.get("uid"), meta.get("name"), reason, message, type, component,
               host, field_path)
        existing = self._event_index.get(agg)
        now = timestamp()

        def bump(event: dict[str, Any]) -> None:
            event["count"] = int(event.get("count") or 1) + 1
            event["lastTimestamp"] = now
            event["involvedObject"] = ref

        if existing is not None:
            bumped = self.mutate("events", existing[1], existing[2], bump)
            if bumped is not None:
                return bumped
        source = {"component": component, **({"host": host} if host else {})}
        event = {"metadata": {"name": f"{meta.get('name')}.{time.time_ns():x}",
                              "namespace": namespace},
                 "involvedObject": ref, "reason": reason, "message": message, "type": type,
                 "count": 1, "firstTimestamp": now, "lastTimestamp": now, "source": source,
                 "reportingComponent": component, "reportingInstance": host or "",
                 "eventTime": None}
        created = self.create("events", event)
        self._event_index[agg] = ("events", namespace, created["metadata"]["name"])
        return created

    # -- internals ---------------------------------------------------------------------------

    def _carry_server_fields(self, resource: str, old: dict[str, Any],
                             new: dict[str, Any]) -> dict[str, Any]:
        """Keep what clients cannot change (uid, creationTimestamp...) and bump generation."""
        res = info(resource)
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        for fixed in ("uid", "creationTimestamp", "name", "namespace"):
            if fixed in old_meta:
                meta[fixed] = old_meta[fixed]
        # Once set, deletion marks stay; a writer may only shorten the grace period.
        for fixed in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if fixed in old_meta and fixed not in meta:
                meta[fixed] = old_meta[fixed]
        if "generation" in old_meta:
            bump = _body(new) != _body(old)
            meta["generation"] = old_meta["generation"] + (1 if bump else 0)
        return new

    def _replace(self, key: ResourceKey, old: dict[str, Any],
                 new: dict[str, Any]) -> dict[str, Any]:
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return copy.deepcopy(old)  # a no-op write keeps its resourceVersion, as etcd does
        meta = new["metadata"]
        # A namespace's own finalizers live in spec; the namespace controller removes it.
        held = meta.get("finalizers") or (key[0] == "namespaces"
                                          and (new.get("spec") or {}).get("finalizers"))
        if meta.get("deletionTimestamp") and not held and (
                key[0] != "pods" or meta.get("deletionGracePeriodSeconds") == 0):
            self._objects[key] = new
            return self.remove(*key) or new
        return self._store(key, new, "MODIFIED")

    def _store(self, key: ResourceKey, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[key] = obj
        self._emit(kind, key[0], obj)
        return copy.deepcopy(obj)

    def _emit(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        shared = copy.deepcopy(obj)
        self._history.append((self._rv, event_type, resource, shared))
        for queue in self._subscribers:
            queue.put_nowait((event_type, resource, shared))

