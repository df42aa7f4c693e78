"""Watch streams: newline-delimited JSON events over chunked HTTP, as the apiserver sends them.

Initial ADDED events or a replay from a resourceVersion, selector transitions (into the
selector is ADDED, out of it DELETED), bookmarks, timeoutSeconds, 410 for a resourceVersion
older than the history, and the stream faults (reset, clean end, 410). Routing is the server's.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from kubesim import selectors, tables
from kubesim.faults import Rule
from kubesim.route import Target
from kubesim.store import Store

BOOKMARK_SECONDS = 60.0  # as the apiserver's watch cache: about once a minute, and at the watch's end


def _expired(rv: str, current: str) -> dict[str, Any]:
    return {"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: {rv} ({current})", "reason": "Expired",
        "code": 410}}


class _Stream:
    """One watcher's filter, the keys it has seen, and its output."""

    def __init__(self, request: web.Request, target: Target, query: dict[str, str]) -> None:
        self.target, self.query = target, query
        self.by_label = selectors.label_matcher(query.get("labelSelector"))
        self.by_field = selectors.field_matcher(target.resource, query.get("fieldSelector"))
        self.as_table = "as=Table" in request.headers.get("Accept", "")
        self.sent: set[tuple[str | None, str]] = set()
        self.response = web.StreamResponse(headers={"Content-Type": "application/json"})

    def key(self, obj: dict[str, Any]) -> tuple[str | None, str]:
        return obj["metadata"].get("namespace"), obj["metadata"]["name"]

    def matches(self, resource: str, obj: dict[str, Any]) -> bool:
        if resource != self.target.resource:
            return False
        meta = obj["metadata"]
        if self.target.namespace is not None and meta.get("namespace") != self.target.namespace:
            return False
        if self.target.name is not None and meta["name"] != self.target.name:
            return False
        return self.by_label(obj) and self.by_field(obj)

    def translate(self, event_type: str, resource: str, obj: dict[str, Any]) -> str | None:
        """The event type this watcher sees for a change, or None when it sees nothing."""
        if resource != self.target.resource:
            return None
        key, now = self.key(obj), self.matches(resource, obj)
        if event_type == "DELETED":
            seen = key in self.sent or now
            self.sent.discard(key)
            return "DELETED" if seen else None
        if now:
            kind = "MODIFIED" if key in self.sent and event_type == "MODIFIED" else "ADDED"
            self.sent.add(key)
            return kind
        if key in self.sent:
            self.sent.discard(key)
            return "DELETED"
        return None

    async def send(self, event_type: str, obj: dict[str, Any]) -> None:
        body: dict[str, Any] = obj
        if self.as_table and event_type in ("ADDED", "MODIFIED", "DELETED"):
            include = self.query.get("includeObject", "Metadata")
            body = tables.table(self.target.resource, [obj],
                                obj["metadata"].get("resourceVersion", ""), include)
        line = json.dumps({"type": event_type, "object": body}, separators=(",", ":")) + "\n"
        await self.response.write(line.encode())

    async def bookmark(self, rv: str) -> None:
        if self.query.get("allowWatchBookmarks", "") in ("true", "1", "True"):
            await self.send("BOOKMARK", {"kind": self.target.res.kind,
                                         "apiVersion": self.target.res.api_version,
                                         "metadata": {"resourceVersion": rv}})


async def _start(stream: _Stream, store: Store, request: web.Request) -> bool:
    """Send the initial events; False when the watch ended with 410."""
    rv = stream.query.get("resourceVersion", "")
    await stream.response.prepare(request)
    if not rv or rv == "0":
        for obj in store.list(stream.target.resource, stream.target.namespace):
            if stream.translate("ADDED", stream.target.resource, obj):
                await stream.send("ADDED", obj)
        return True
    history = store.history_since(int(rv))
    if history is None:
        await stream.response.write((json.dumps(_expired(rv, store.resource_version)) + "\n")
                                    .encode())
        return False
    changed = {stream.key(o) for _, t, _r, o in history if t == "ADDED"}
    for obj in store.list(stream.target.resource, stream.target.namespace):
        if stream.key(obj) not in changed and stream.matches(stream.target.resource, obj):
            stream.sent.add(stream.key(obj))
    for _, event_type, resource, obj in history:
        seen = stream.translate(event_type, resource, obj)
        if seen:
            await stream.send(seen, obj)
    return True


async def serve(request: web.Request, store: Store, target: Target, query: dict[str, str],
                fault: Rule | None) -> web.StreamResponse:
    """Serve one watch until timeoutSeconds, a fault, or the client going away."""
    stream = _Stream(request, target, query)
    started = time.monotonic()
    deadline = started + float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
    fault_at = started + fault.after if fault is not None and fault.watch else None
    queue = store.subscribe()
    try:
        return await _pump(stream, store, request, queue, deadline, fault_at, fault)
    except ConnectionResetError:  # the client went away mid-write
        return stream.response
    finally:
        store.unsubscribe(queue)


async def _pump(stream: _Stream, store: Store, request: web.Request, queue: Any,
                deadline: float | None, fault_at: float | None,
                fault: Rule | None) -> web.StreamResponse:
    """Initial events, then live ones until the deadline, a fault or the client leaving."""
    if not await _start(stream, store, request):
        await stream.response.write_eof()
        return stream.response
    next_bookmark = time.monotonic() + BOOKMARK_SECONDS
    while True:
        now = time.monotonic()
        if fault_at is not None and now >= fault_at:
            return await _disturb(stream, request, fault, store)  # type: ignore[arg-type]
        if deadline is not None and now >= deadline:
            break
        if now >= next_bookmark:
            await stream.bookmark(store.resource_version)
            next_bookmark = now + BOOKMARK_SECONDS
        if request.transport is None or request.transport.is_closing():
            return stream.response  # the client went away: nothing reads what follows
        wake = min(t for t in (deadline, fault_at, next_bookmark) if t is not None)
        try:
            event_type, resource, obj = await asyncio.wait_for(queue.get(),
                                                               max(wake - now, 0.001))
        except asyncio.TimeoutError:
            continue
        seen = stream.translate(event_type, resource, obj)
        if seen:
            await stream.send(seen, obj)
    await stream.bookmark(store.resource_version)
    await stream.response.write_eof()
    return stream.response


async def _disturb(stream: _Stream, request: web.Request, fault: Rule,
                   store: Store) -> web.StreamResponse:
    if fault.watch == "reset":
        # Abort the TCP connection mid-chunk: clients see a broken stream, not a clean end.
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError
    if fault.watch == "expired":
        rv = stream.query.get("resourceVersion") or store.resource_version
        await stream.response.write((json.dumps(_expired(rv, store.resource_version)) + "\n")
                                    .encode())
    await stream.response.write_eof()
    return stream.response
