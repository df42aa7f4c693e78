"""The server process: the aiohttp app, its middleware, and the cluster's start and stop.

Builds the Store, seeds the system namespaces, routes discovery, the control API and resource
paths, applies fault rules and logs every request, then starts the garbage collector and
`kubesim.controllers` (when present). REST semantics live in rest.py.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import signal
import ssl
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from kubesim import discovery, gc, openapi, route, serviceaccount
from kubesim.config import SimConfig
from kubesim.control import Control, controllers_module
from kubesim.errors import ApiError, MethodNotAllowed, NotFound, status_for
from kubesim.faults import Faults, Rule
from kubesim.rest import Api, json_response
from kubesim.store import Store

log = logging.getLogger("kubesim.server")
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_HEALTH = ("/healthz", "/readyz", "/livez")


class Server:
    """One simulated cluster's API: store, REST, control API and faults."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.store = Store(history=config.history)
        self.faults = Faults()
        self.api = Api(self.store, config)
        self.control = Control(self.store, self.faults)
        self.address = "127.0.0.1:0"
        for name in SYSTEM_NAMESPACES:
            self.api.create_object(route.parse("POST", "/api/v1/namespaces", {}),  # type: ignore[arg-type]
                                   {"metadata": {"name": name}}, dry_run=False)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/_kubesim/"):
            try:
                response: web.StreamResponse = await handler(request)
                return response
            except ApiError as exc:
                return json_response(exc.status(), exc.code, exc.headers)
        target = route.parse(request.method, request.path, request.query)
        request["target"] = target
        info = {"method": request.method, "path": request.path, "query": dict(request.query),
                "verb": target.verb if target else None,
                "resource": target.resource if target else None,
                "namespace": target.namespace if target else None,
                "name": target.name if target else None,
                "subresource": target.sub if target else None,
                "scheme": request.scheme, "user": serviceaccount.user_of(request.headers)}
        if target is not None and self.faults.wants_labels:
            info["labels"] = await self._labels(request, target)
        rule = self.faults.match(info)
        info.pop("labels", None)
        request["fault"] = rule
        entry = self.faults.log(info, rule)
        response = await self._answer(request, handler, rule)
        entry["code"] = response.status
        return response

    async def _labels(self, request: web.Request, target: route.Target) -> dict[str, str]:
        """Labels of the object a request addresses: stored, or in a create's body."""
        if target.name is not None:
            stored = self.store.get(target.resource, target.namespace, target.name) or {}
            return dict((stored.get("metadata") or {}).get("labels") or {})
        if request.method == "POST" and request.can_read_body:
            try:
                body = json.loads(await request.read())  # aiohttp keeps it for the handler
            except ValueError:
                return {}
            if isinstance(body, dict):
                return dict((body.get("metadata") or {}).get("labels") or {})
        return {}

    async def _answer(self, request: web.Request, handler: Any,
                      rule: Rule | None) -> web.StreamResponse:
        try:
            if rule is not None and rule.delay:
                await asyncio.sleep(rule.delay)
            if rule is not None and rule.status is not None:
                headers = {"Retry-After": str(rule.retry_after if rule.retry_after is not None
                                              else 1)} if rule.status == 429 else None
                message = rule.message or f"kubesim fault rule {rule.id}"
                return json_response(status_for(rule.status, message), rule.status, headers)
            return await handler(request)  # type: ignore[no-any-return]
        except ApiError as exc:
            return json_response(exc.status(), exc.code, exc.headers)
        except (web.HTTPException, asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # a kubesim bug: answer like the apiserver, log the trace
            log.exception("internal error on %s %s", request.method, request.path)
            return json_response(status_for(500, f"kubesim internal error: {exc!r}"), 500)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in _HEALTH:
            return web.Response(text="ok")
        if path.startswith("/_kubesim"):
            return await self.control.handle(request)
        document = self._discovery(path)
        if document is not None:
            return json_response(document)
        target: route.Target | None = request.get("target")
        if target is None:
            raise NotFound("the server could not find the requested resource")
        handlers = {"list": self.api.list_or_watch, "watch": self.api.list_or_watch, "get": self.api.get,
                    "create": self.api.create, "update": self.api.update,
                    "patch": self.api.patch, "delete": self.api.delete,
                    "deletecollection": self.api.delete}
        handler = handlers.get(target.verb)
        if handler is None or (target.sub == "log" and request.method != "GET") or (
                target.sub == "eviction" and request.method != "POST"):
            raise MethodNotAllowed("the server does not allow this method on the requested "
                                   "resource")
        return await handler(request, target)

    def _discovery(self, path: str) -> dict[str, Any] | None:
        parts = [p for p in path.split("/") if p]
        if path == "/version":
            return discovery.VERSION
        if path == "/openapi/v3" or path.startswith("/openapi/v3/"):
            return openapi.lookup(path)
        if path == "/api":
            return discovery.api_versions(self.address)
        if path == "/apis":
            return discovery.group_list()
        if len(parts) == 2 and parts[0] == "api":
            return discovery.resource_list("", parts[1])
        if len(parts) == 2 and parts[0] == "apis":
            return discovery.group(parts[1])
        if len(parts) == 3 and parts[0] == "apis":
            return discovery.resource_list(parts[1], parts[2])
        return None


def write_kubeconfig(path: Path, url: str) -> None:
    """A kubeconfig for url, written atomically (the fixture waits for the file)."""
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "kubesim", "preferences": {},
           "clusters": [{"name": "kubesim", "cluster": {"server": url}}],
           "users": [{"name": "kubesim", "user": {"token": "kubesim"}}],
           "contexts": [{"name": "kubesim", "context": {"cluster": "kubesim", "user": "kubesim",
                                                        "namespace": "default"}}]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, path)


async def _start_controllers(server: Server, url: str) -> list[asyncio.Task[Any]]:
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(gc.run(server.store), name="gc")]
    module = controllers_module()
    if module is None:
        log.warning("kubesim.controllers is absent: no scheduler, kubelets or job controller")
        return tasks
    started = module.start(server.store, server.config)
    if inspect.isawaitable(started):
        started = await started
    if hasattr(module, "set_api_url"):
        module.set_api_url(url, server.store)
    return tasks + list(started)


class Listener:
    """The listening sockets (plain HTTP for kubeconfigs, HTTPS for pods' in-cluster clients),
    which an outage fault closes and reopens on the same ports."""

    def __init__(self, runner: web.AppRunner, host: str,
                 tls: ssl.SSLContext | None = None) -> None:
        self.runner, self.host, self.tls = runner, host, tls
        self.port = 0
        self.tls_port = 0
        self.site: web.TCPSite | None = None
        self.tls_site: web.TCPSite | None = None
        self._reopening: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        # Open watches and log follows end with the server; don't wait a minute for them.
        self.site, self.port = await self._site(self.port, None)
        if self.tls is not None:
            self.tls_site, self.tls_port = await self._site(self.tls_port, self.tls)

    async def _site(self, port: int, tls: ssl.SSLContext | None) -> tuple[web.TCPSite, int]:
        before = set(self.runner.addresses)
        site = web.TCPSite(self.runner, self.host, port, shutdown_timeout=0.5, ssl_context=tls)
        await site.start()
        return site, next(a for a in self.runner.addresses if a not in before)[1]

    async def outage(self, seconds: float, spare: object = None) -> None:
        """Refuse connections from now on, cutting the open ones but `spare` (the connection
        that asked, so its answer can leave); listen again `seconds` later, in the background.

        The port is closed when this returns, so a client told the outage began cannot reach
        the server on any connection.
        """
        for site in (self.site, self.tls_site):
            if site is not None:
                await site.stop()
        server = self.runner.server
        for connection in list(server.connections if server is not None else []):
            if connection is not spare:
                connection.force_close()
        task = asyncio.ensure_future(self._reopen(seconds))
        self._reopening.add(task)
        task.add_done_callback(self._reopening.discard)

    async def _reopen(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.open()
        log.info("outage over after %.2fs", seconds)


async def serve(config: SimConfig, host: str = "127.0.0.1", port: int = 0,
                kubeconfig: Path | None = None) -> None:
    """Run the cluster until SIGTERM/SIGINT, then stop controllers and their processes."""
    server = Server(config)
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    _, certificate, key = serviceaccount.write_certificates(config.root / "pki")
    listener = Listener(runner, host, serviceaccount.server_context(certificate, key))
    listener.port = port
    await listener.open()
    server.control.outage = listener.outage
    bound = listener.port
    server.address = f"{host}:{bound}"
    url = f"http://{host}:{bound}"
    in_cluster = f"https://{host}:{listener.tls_port}"
    tasks = await _start_controllers(server, in_cluster)
    (config.root / "in-cluster.json").write_text(json.dumps(
        {"url": in_cluster, "ca": str(config.root / "pki" / "ca.crt")}))
    if kubeconfig is not None:
        write_kubeconfig(kubeconfig, url)
    print(f"kubesim listening on {url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: controllers")
    await _shutdown(server.store, tasks)
    log.info("stopping: HTTP server")
    await runner.cleanup()
    log.info("stopped")


def run(config: SimConfig, host: str = "127.0.0.1", port: int = 0,
        kubeconfig: Path | None = None) -> None:
    """serve() on a fresh loop whose leftover tasks get a bounded time to end.

    asyncio.run would wait forever for a task that ignores cancellation, and the fixture would
    then have to SIGKILL the server; stragglers are logged by name instead.
    """
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(serve(config, host, port, kubeconfig))
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            _, stuck = loop.run_until_complete(asyncio.wait(pending, timeout=2))
            for task in stuck:
                log.warning("task %s ignored cancellation: %r", task.get_name(), task.get_coro())
    finally:
        loop.close()


async def _shutdown(store: Store, tasks: list[asyncio.Task[Any]]) -> None:
    module = controllers_module()
    stop = getattr(module, "shutdown", None) if module else None
    if stop is not None:
        try:
            result = stop(store)
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, 10)
        except Exception:  # shutdown goes on: the fixture still kills what is left
            log.exception("controllers shutdown failed")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
