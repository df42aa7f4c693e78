"""A reverse proxy on loopback that injects the faults a real network and a loaded API server produce.

Between Prefect clients (workers, flow processes, hooks) and the Prefect server: a fraction of HTTP
requests get a 502/503 answer or a dropped connection before they reach the server. Requests that
create a deployment's flow run get worse: a 500 before the server sees them, a 500 after the server
acted on them, or a lost answer (forwarded, then the connection closed: the server acted, the
client never heard). Websockets (events, logs) are passed through. The proxy counts what it did,
so a test can first check that faults happened before claiming they changed nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from services.ports import free_port

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "content-length", "host",
              "content-encoding", "proxy-connection", "te", "trailer"}
CREATES_FLOW_RUN = re.compile(r"/deployments/[^/]+/create_flow_run$")
CREATE_FAULTS = ("server-error", "late-error", "lost-answer")


@dataclass
class FaultPlan:
    """How often each fault happens; `seed` makes a run of faults repeatable."""

    error_rate: float = 0.03  # 502/503 before the server sees the request
    drop_rate: float = 0.02  # connection closed before the server sees the request
    create_fault_rate: float = 0.3  # create_flow_run: one of CREATE_FAULTS
    first_creates: tuple[str, ...] = ()  # the faults of the first create_flow_run requests, in order
    seed: int = 20261201
    enabled: bool = True
    counts: Counter = field(default_factory=Counter)


class FaultyProxy:
    """The proxy's aiohttp application, forwarding to `upstream` (e.g. http://127.0.0.1:4200)."""

    def __init__(self, upstream: str, plan: FaultPlan) -> None:
        self.upstream, self.plan = upstream.rstrip("/"), plan
        self._random = random.Random(plan.seed)
        self._session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("upgrade", "").lower() == "websocket":
            return await self._websocket(request)
        fault = self._pick_fault(request)
        if fault == "error":
            return web.Response(status=self._random.choice((502, 503)), text="injected fault")
        if fault == "drop":
            return self._drop(request)
        if fault == "server-error":
            return web.Response(status=500, text="injected fault")
        try:
            response = await self._forward(request)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            self.plan.counts["upstream-failed"] += 1
            return self._drop(request)  # as the network would show it: no answer
        if fault == "lost-answer":
            return self._drop(request)
        if fault == "late-error":
            return web.Response(status=500, text="injected fault after the server acted")
        self.plan.counts["forwarded"] += 1
        return response

    def _pick_fault(self, request: web.Request) -> str | None:
        if not self.plan.enabled:
            return None
        roll = self._random.random()
        creates = request.method == "POST" and CREATES_FLOW_RUN.search(request.path) is not None
        if creates and self.plan.counts["create"] < len(self.plan.first_creates):
            kind = self.plan.first_creates[self.plan.counts["create"]]
        elif creates and roll < self.plan.create_fault_rate:
            kind = self._random.choice(CREATE_FAULTS)
        elif roll < self.plan.error_rate:
            kind = "error"
        elif roll < self.plan.error_rate + self.plan.drop_rate:
            kind = "drop"
        else:
            kind = None
        self.plan.counts["create"] += creates
        if kind:
            self.plan.counts[kind] += 1
        return kind

    def _drop(self, request: web.Request) -> web.Response:
        if request.transport is not None:
            request.transport.abort()  # a reset connection: the client sees no answer at all
        return web.Response(status=502)  # never sent: the transport is gone

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                         data=await request.read(), allow_redirects=False) as upstream:
            body = await upstream.read()
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            return web.Response(status=upstream.status, headers=kept, body=body)

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        assert self._session is not None
        # Prefect negotiates its own subprotocol ("prefect") for the auth handshake: pass it on.
        asked = [p.strip() for p in request.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        target = self.upstream.replace("http", "ws", 1) + request.path_qs
        async with self._session.ws_connect(target, autoping=True, protocols=asked) as server_ws:
            client_ws = web.WebSocketResponse(autoping=True, protocols=[server_ws.protocol] if server_ws.protocol else [])
            await client_ws.prepare(request)
            await asyncio.gather(_pump(client_ws, server_ws), _pump(server_ws, client_ws), return_exceptions=True)
        self.plan.counts["websocket"] += 1
        return client_ws

    async def start(self, port: int) -> web.AppRunner:
        # A fresh upstream connection per request: a pooled one the server already closed would fail
        # requests the plan never meant to fail.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                              timeout=aiohttp.ClientTimeout(total=None, sock_read=300))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _pump(source, sink) -> None:
    async for message in source:
        if message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        else:
            break
    await sink.close()


@contextlib.contextmanager
def faulty_proxy(upstream: str, plan: FaultPlan) -> Iterator[str]:
    """Run the proxy in a thread of its own; yields its base URL (same path layout as `upstream`)."""
    loop, port = asyncio.new_event_loop(), free_port()
    proxy = FaultyProxy(upstream, plan)
    thread = threading.Thread(target=loop.run_forever, name="faulty-proxy", daemon=True)
    thread.start()
    runner = asyncio.run_coroutine_threadsafe(proxy.start(port), loop).result(timeout=30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
