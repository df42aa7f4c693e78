"""The control API under /_kubesim/: fault rules, the request log, and disruptions.

Disruptions that act on pods and nodes (OOM kill, pressure eviction, preemption, partition,
crash, heal) are carried out by functions of `kubesim.controllers`; this module only routes
HTTP calls to them. The Python side of these calls is fixture.py.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from aiohttp import web

from kubesim.errors import ApiError, BadRequest, NotFound
from kubesim.faults import Faults
from kubesim.store import Store


NODE_ACTIONS = {"partition": "partition", "crash": "crash", "heal": "heal",
                "delete": "delete_node"}


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


def controllers_module() -> ModuleType | None:
    """kubesim.controllers if it is present (the node side of the cluster)."""
    try:
        return importlib.import_module("kubesim.controllers")
    except ModuleNotFoundError as exc:
        if exc.name != "kubesim.controllers":
            raise
        return None


class Control:
    """Handlers for /_kubesim/... requests."""

    def __init__(self, store: Store, faults: Faults) -> None:
        self.store, self.faults = store, faults
        # Set by the server once it listens: close the port now (sparing the asking connection),
        # reopen it some seconds later.
        self.outage: Callable[[float, object], Awaitable[None]] | None = None

    async def _body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise BadRequest(f"control API: body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("control API: body must be a JSON object")
        return body

    async def handle(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p][1:]
        method = request.method
        if parts == ["faults"]:
            if method == "POST":
                return _json(self.faults.add(await self._body(request)).public(), 201)
            if method == "DELETE":
                self.faults.clear()
                return _json({"cleared": True})
            return _json([r.public() for r in self.faults.rules])
        if parts == ["requests"]:
            if method == "DELETE":
                self.faults.requests.clear()
                return _json({"cleared": True})
            return _json(self.faults.requests)
        if parts == ["outage"] and method == "POST":
            return await self._outage(request, await self._body(request))
        if parts == ["compact"] and method == "POST":
            self.store.compact()
            return _json({"resourceVersion": self.store.resource_version})
        if method == "POST" and len(parts) == 4 and parts[0] == "pods":
            return await self._pod_action(request, parts[1], parts[2], parts[3])
        if method == "POST" and len(parts) == 3 and parts[0] == "nodes":
            if parts[2] not in NODE_ACTIONS:
                raise NotFound(f"control API: unknown node action {parts[2]!r}; use one of "
                               f"{', '.join(NODE_ACTIONS)}")
            return await self._call(NODE_ACTIONS[parts[2]], parts[1], store=self.store)
        raise NotFound(f"control API: no route {method} {request.path}")

    async def _outage(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        seconds = body.get("seconds")
        if not isinstance(seconds, (int, float)) or not 0 < seconds <= 300:
            raise BadRequest("control API: outage needs seconds, a number in (0, 300]")
        if self.outage is None:
            raise _NotImplemented("control API: the server cannot close its port")
        await self.outage(float(seconds), request.protocol)
        # This connection was spared so the answer can leave; it is not kept for another request.
        return web.json_response({"outage_seconds": seconds}, headers={"Connection": "close"})

    async def _pod_action(self, request: web.Request, namespace: str, name: str,
                          action: str) -> web.StreamResponse:
        body = await self._body(request)
        if self.store.get("pods", namespace, name) is None:
            raise NotFound.of("pods", name)
        if action == "oom-kill":
            return await self._call("oom_kill", self.store, namespace, name,
                                    body.get("container"))
        if action == "evict":
            return await self._call("evict", self.store, namespace, name,
                                    resource=body.get("resource", "memory"))
        if action == "preempt":
            return await self._call("preempt", self.store, namespace, name,
                                    grace_seconds=_grace_seconds(body))
        raise NotFound(f"control API: unknown pod action {action!r}; use oom-kill, evict or "
                       "preempt")

    async def _call(self, function: str, *args: Any, **kwargs: Any) -> web.StreamResponse:
        module = controllers_module()
        fn: Callable[..., Any] | None = getattr(module, function, None) if module else None
        if fn is None:
            raise _NotImplemented(f"control API: kubesim.controllers.{function} is not available")
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return _json({"done": function, "result": result if _plain(result) else None})


def _grace_seconds(body: dict[str, Any]) -> int | None:
    """The victim's grace period from a preempt body; None keeps the pod's own."""
    grace = body.get("grace_seconds")
    # bool is an int to isinstance, but true is no grace period.
    if grace is None or (isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0):
        return grace
    raise BadRequest(f"control API: preempt grace_seconds must be a whole number of seconds "
                     f">= 0 or null, not {grace!r}")


def _plain(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class _NotImplemented(ApiError):
    code = 501
    reason = "NotImplemented"
