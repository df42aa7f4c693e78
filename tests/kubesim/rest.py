"""REST verbs over the store with the apiserver's status codes and shapes.

list/get/create/update/patch/delete/deletecollection, the status split, paging, dry runs, Table
negotiation and the eviction subresource. Routing, middleware and the app itself are server.py's;
watch streams and log files have their own modules.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import yaml
from aiohttp import web

from kubesim import admission, deletion, logs, patch, tables, watch
from kubesim.config import SimConfig
from kubesim.errors import (BadRequest, Expired, Forbidden, MethodNotAllowed, NotFound,
                            UnsupportedMediaType)
from kubesim.route import Target
from kubesim.store import Store, timestamp


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    return web.Response(text=json.dumps(body, separators=(",", ":")), status=status,
                        content_type="application/json", headers=headers)


def _true(value: str | None) -> bool:
    return (value or "") in ("true", "True", "1", "t")


class Api:
    """The REST surface over one Store."""

    def __init__(self, store: Store, config: SimConfig) -> None:
        self.store, self.config = store, config

    # -- reading ---------------------------------------------------------------------------

    def _wants_table(self, request: web.Request) -> bool:
        return "as=Table" in request.headers.get("Accept", "")

    async def list_or_watch(self, request: web.Request, t: Target) -> web.StreamResponse:
        query = dict(request.query)
        if t.verb == "watch":
            return await watch.serve(request, self.store, t, query, request.get("fault"))
        items = self.store.list(t.resource, t.namespace, label_selector=query.get("labelSelector"),
                                field_selector=query.get("fieldSelector"))
        rv = self.store.resource_version
        meta: dict[str, Any] = {"resourceVersion": rv}
        items = self._page(items, query, meta)
        if self._wants_table(request):
            return json_response(tables.table(t.resource, items, rv,
                                              query.get("includeObject", "Metadata"), meta))
        return json_response({"kind": f"{t.res.kind}List", "apiVersion": t.res.api_version,
                              "metadata": meta, "items": items})

    def _page(self, items: list[dict[str, Any]], query: dict[str, str],
              meta: dict[str, Any]) -> list[dict[str, Any]]:
        """Apply limit/continue; the token holds the list's RV and the last key returned."""
        if query.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(query["continue"]))
            except ValueError as exc:
                raise BadRequest("continue key is not valid: illegal base64 data") from exc
            if self.store.history_since(int(token["rv"])) is None:
                raise Expired("The provided continue parameter is too old to display a "
                              "consistent list result. You can start a new list without the "
                              "continue parameter, or use the continue token in this response "
                              "to retrieve the remainder of the results.")
            last = tuple(token["start"])
            items = [o for o in items if (o["metadata"].get("namespace") or "",
                                          o["metadata"]["name"]) > last]
        limit = int(query.get("limit") or 0)
        if limit and len(items) > limit:
            last_obj = items[limit - 1]["metadata"]
            token = {"rv": meta["resourceVersion"],
                     "start": [last_obj.get("namespace") or "", last_obj["name"]]}
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return items

    async def get(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.name is not None
        if t.sub == "log":
            assert t.namespace is not None
            return await logs.serve(request, self.store, self.config.root, t.namespace, t.name)
        obj = self.store.get(t.resource, t.namespace, t.name)
        if obj is None:
            raise NotFound.of(t.resource, t.name)
        if self._wants_table(request):
            return json_response(tables.table(t.resource, [obj], obj["metadata"]["resourceVersion"],
                                              request.query.get("includeObject", "Metadata")))
        return json_response(obj)

    # -- writing ---------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> Any:
        if "protobuf" in request.content_type:
            raise UnsupportedMediaType('the body of the request was in an unknown format - '
                                       'accepted media types include: application/json, '
                                       'application/yaml')
        raw = await request.read()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            if "yaml" not in request.content_type:
                raise BadRequest(f"the body of the request could not be decoded as JSON: "
                                 f"{exc}") from exc
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise BadRequest(f"the body of the request could not be decoded as YAML: "
                             f"{exc}") from exc

    def _check_scope(self, t: Target, obj: dict[str, Any]) -> None:
        meta = obj.setdefault("metadata", {})
        if t.res.namespaced:
            if meta.get("namespace") and meta["namespace"] != t.namespace:
                raise BadRequest("the namespace of the provided object does not match the "
                                 "namespace sent on the request")
            meta["namespace"] = t.namespace
            ns = self.store.get("namespaces", None, t.namespace or "")
            if ns is None:
                raise NotFound.of("namespaces", t.namespace or "")
            if ns["metadata"].get("deletionTimestamp") and t.name is None:
                raise Forbidden(f"{t.res.qualified} \"{meta.get('name') or ''}\" is forbidden: "
                                f"unable to create new content in namespace {t.namespace} "
                                "because it is being terminated")
        if t.name is not None and meta.get("name") and meta["name"] != t.name:
            raise BadRequest("the name of the object (%s) does not match the name on the URL "
                             "(%s)" % (meta["name"], t.name))

    def create_object(self, t: Target, obj: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        """Admission then storage; also used by apply when the object is new."""
        self._check_scope(t, obj)
        meta = obj["metadata"]
        for owned in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                      "deletionGracePeriodSeconds", "generation", "managedFields"):
            meta.pop(owned, None)
        admission.default(t.resource, obj)
        admission.validate(t.resource, obj)
        if dry_run:
            meta.setdefault("name", meta.get("generateName", "") + "dryrun")
            meta.setdefault("creationTimestamp", timestamp())
            return obj
        created = self.store.create(t.resource, obj)
        if t.resource == "namespaces":
            self._namespace_defaults(created["metadata"]["name"])
        return created

    def _namespace_defaults(self, namespace: str) -> None:
        if self.store.get("serviceaccounts", namespace, "default") is None:
            self.store.create("serviceaccounts", {"metadata": {"name": "default",
                                                               "namespace": namespace}})

    async def create(self, request: web.Request, t: Target) -> web.StreamResponse:
        if t.sub == "eviction":
            return await self.evict(request, t)
        if t.name is not None:
            raise MethodNotAllowed("the server does not allow this method on the requested "
                                   "resource")
        body = await self._body(request)
        if not isinstance(body, dict):
            raise BadRequest("the body of the request must be a JSON object")
        dry_run = request.query.get("dryRun") == "All"
        return json_response(self.create_object(t, body, dry_run), status=201)

    def _save(self, t: Target, old: dict[str, Any], new: dict[str, Any],
              dry_run: bool) -> dict[str, Any]:
        """Store new over old with the main/status split of the API."""
        if t.sub == "status":
            new = {**old, "status": new.get("status"),
                   "metadata": {**old["metadata"],
                                "resourceVersion": new.get("metadata", {}).get("resourceVersion")
                                or old["metadata"]["resourceVersion"]}}
        elif "status" in t.res.subresources:
            new = {**new, "status": old.get("status")}
            if new["status"] is None:
                new.pop("status")
            admission.validate_update(t.resource, old, new)
        if dry_run:
            return new
        return self.store.update(t.resource, new, subresource=t.sub)

    async def update(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.name is not None
        body = await self._body(request)
        if not isinstance(body, dict):
            raise BadRequest("the body of the request must be a JSON object")
        self._check_scope(t, body)
        old = self.store.get(t.resource, t.namespace, t.name)
        if old is None:
            raise NotFound.of(t.resource, t.name)
        body["metadata"].setdefault("name", t.name)
        return json_response(self._save(t, old, body, request.query.get("dryRun") == "All"))

    async def patch(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.name is not None
        body = await self._body(request)
        content_type = request.headers.get("Content-Type", "")
        old = self.store.get(t.resource, t.namespace, t.name)
        dry_run = request.query.get("dryRun") == "All"
        if old is None:
            if content_type.startswith("application/apply-patch"):
                if not request.query.get("fieldManager"):
                    raise BadRequest("PATCH, application/apply-patch+yaml: fieldManager is "
                                     "required for apply requests")
                return json_response(self.create_object(t, body, dry_run), status=201)
            raise NotFound.of(t.resource, t.name)
        new = patch.apply(content_type, old, body)
        new.setdefault("metadata", {})["name"] = t.name
        if t.namespace:
            new["metadata"]["namespace"] = t.namespace
        return json_response(self._save(t, old, new, dry_run))

    async def delete(self, request: web.Request, t: Target) -> web.StreamResponse:
        options = await self._body(request) if request.can_read_body else {}
        options = options if isinstance(options, dict) else {}
        query = request.query
        propagation = query.get("propagationPolicy") or options.get("propagationPolicy")
        if propagation is None and _true(query.get("orphanDependents")):
            propagation = "Orphan"
        grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
        uid = (options.get("preconditions") or {}).get("uid")
        if "All" in (query.get("dryRun"), *(options.get("dryRun") or [])):
            return self._dry_delete(t)
        if t.name is None:
            return self._delete_collection(t, dict(query), propagation, grace)
        body, warnings = deletion.delete_object(
            self.store, t.resource, t.namespace, t.name, propagation=propagation,
            grace=None if grace is None else int(grace), uid=uid)
        headers = {"Warning": warnings[0]} if warnings else None
        return json_response(body, headers=headers)

    def _dry_delete(self, t: Target) -> web.StreamResponse:
        """What a delete would answer, changing nothing (kubectl delete --dry-run=server)."""
        if t.name is None:
            return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Success"})
        obj = self.store.get(t.resource, t.namespace, t.name)
        if obj is None:
            raise NotFound.of(t.resource, t.name)
        return json_response(obj)

    def _delete_collection(self, t: Target, query: dict[str, str], propagation: str | None,
                           grace: Any) -> web.StreamResponse:
        items = self.store.list(t.resource, t.namespace,
                                label_selector=query.get("labelSelector"),
                                field_selector=query.get("fieldSelector"))
        for obj in items:
            deletion.delete_object(self.store, t.resource, obj["metadata"].get("namespace"),
                                   obj["metadata"]["name"], propagation=propagation,
                                   grace=None if grace is None else int(grace))
        return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success"})

    async def evict(self, request: web.Request, t: Target) -> web.StreamResponse:
        """POST pods/X/eviction: DisruptionTarget, then a graceful delete."""
        assert t.name is not None and t.namespace is not None
        body = await self._body(request)
        if self.store.get("pods", t.namespace, t.name) is None:
            raise NotFound.of("pods", t.name)
        options = (body or {}).get("deleteOptions") or {}
        add_condition(self.store, t.namespace, t.name, "EvictionByEvictionAPI",
                      "Eviction API: evicting")
        grace = options.get("gracePeriodSeconds")
        deletion.delete_object(self.store, "pods", t.namespace, t.name,
                               grace=None if grace is None else int(grace))
        return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success"}, status=201)


def add_condition(store: Store, namespace: str, name: str, reason: str, message: str) -> None:
    """Set the pod's DisruptionTarget condition (before it is deleted)."""
    def change(pod: dict[str, Any]) -> None:
        conds = pod.setdefault("status", {}).setdefault("conditions", [])
        conds[:] = [c for c in conds if c.get("type") != "DisruptionTarget"]
        conds.append({"type": "DisruptionTarget", "status": "True", "reason": reason,
                      "message": message, "lastProbeTime": None,
                      "lastTransitionTime": timestamp()})

    store.mutate("pods", namespace, name, change)
