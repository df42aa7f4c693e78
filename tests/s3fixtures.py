"""A real S3 HTTP server on loopback for the tests (moto in server mode), and a fault proxy before it.

boto3 talks HTTP to these exactly as to S3; nothing of boto3 is patched. The proxy forwards each
request to moto unless told otherwise: it can answer chosen requests with an S3 error (503
SlowDown, 403 AccessDenied), hold a request until the test lets it go, or go down (its port closed,
open connections dropped without an answer) and come back on the same port.
"""

from __future__ import annotations

import http.client
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from trainguard.core.stores.s3.store import UploadPolicy
from trainguard.core.stores.s3.spool import MIN_PART_BYTES

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIATRAINGUARDTEST",
    "AWS_SECRET_ACCESS_KEY": "planted-aws-secret-7d1f0c",
    "AWS_DEFAULT_REGION": "us-east-1",
}

# Uploads that give up fast: the tests inject faults and must not wait out production backoff.
FAST = UploadPolicy(attempts=4, base_delay_seconds=0.01, max_delay_seconds=0.05, budget_seconds=None,
                    part_bytes=MIN_PART_BYTES, concurrency=3)

Match = Callable[[str, str], bool]  # (method, path with query) -> whether a rule applies


@dataclass
class _Fault:
    match: Match
    status: int
    code: str
    times: int


@dataclass
class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` (host, port)."""

    upstream: tuple[str, int]
    port: int = 0
    requests: list[tuple[str, str]] = field(default_factory=list)
    _faults: list[_Fault] = field(default_factory=list)
    _hold: Match | None = None
    _hold_every: bool = False
    holding: int = 0
    held_total: int = 0
    held: threading.Event = field(default_factory=threading.Event)
    _release: threading.Event = field(default_factory=threading.Event)
    _down: bool = False
    _down_on: Match | None = None
    _then_hang: bool = False
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        """Listen (again, on the same port once it has one)."""
        self._down = False
        self._server = _ProxyServer(("127.0.0.1", self.port), _Handler)
        self._server.proxy = self  # type: ignore[attr-defined]
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        """Close the port and drop every open connection without an answer."""
        self._down = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._release.set()

    def fail(self, match: Match, status: int, code: str, times: int = 1_000_000) -> None:
        """Answer the next ``times`` matching requests with an S3 error instead of forwarding them."""
        with self._lock:
            self._faults.append(_Fault(match, status, code, times))

    def hold(self, match: Match, every: bool = False) -> None:
        """Keep the next matching request (``every``: each one) waiting until `release` or `down`.

        `held` is set once one waits; `holding` counts those waiting now, `held_total` all that waited
        since: a hanging S3, as clients see it.
        """
        self._hold, self._hold_every, self.held, self._release = match, every, threading.Event(), threading.Event()

    def down_on(self, match: Match, then_hang: bool = False) -> None:
        """Go down the moment a matching request arrives, dropping it unanswered: S3 dying mid-upload.

        ``then_hang``: stay up instead, holding every later request (an endpoint whose S3 died).
        """
        self._down_on, self._then_hang = match, then_hang

    def release(self) -> None:
        self._release.set()

    def reset(self) -> None:
        with self._lock:
            self._faults.clear()
            self.requests.clear()
        self._hold = self._down_on = None
        self._hold_every = False
        self.held_total = 0
        self._release.set()

    def _fault_for(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            self.requests.append((method, path))
            for fault in self._faults:
                if fault.times > 0 and fault.match(method, path):
                    fault.times -= 1
                    return fault
        return None


class _ProxyServer(ThreadingHTTPServer):
    """The proxy's server: a client that hangs up before its answer (boto3 giving up on a held
    request) is what the faults are for, not an error to print."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """Forwards one request to moto, or answers it as the proxy's rules say."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _relay(self) -> None:
        proxy: FaultProxy = self.server.proxy  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if proxy._down_on is not None and proxy._down_on(self.command, self.path):
            proxy._down_on = None
            if proxy._then_hang:
                proxy.hold(lambda method, path: True, every=True)
                self.close_connection = True
                return
            proxy.down()
        if proxy._down or not self._after_hold(proxy):
            self.close_connection = True  # dropped without an answer, as by a dead server
            return
        if fault := proxy._fault_for(self.command, self.path):
            return self._error(fault)
        upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "connection")}
        upstream.request(self.command, self.path, body=body or None, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                self.send_header(name, value)
        length = answer.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        upstream.close()

    def _after_hold(self, proxy: FaultProxy) -> bool:
        """Wait here if the test holds this request; False if the proxy went down meanwhile."""
        hold, release = proxy._hold, proxy._release
        if hold is not None and hold(self.command, self.path):
            if not proxy._hold_every:
                proxy._hold = None
            with proxy._lock:
                proxy.holding += 1
                proxy.held_total += 1
            proxy.held.set()
            release.wait(60)
            with proxy._lock:
                proxy.holding -= 1
        return not proxy._down

    def _error(self, fault: _Fault) -> None:
        data = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{fault.code}</Code>"
                f"<Message>injected {fault.code}</Message><RequestId>x</RequestId></Error>").encode()
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


@dataclass
class S3Server:
    """moto on loopback, the fault proxy before it, and a boto3 client of the moto side for checks."""

    moto_url: str
    proxy: FaultProxy
    _client: Any = None

    def client(self) -> Any:
        if self._client is None:
            self._client = boto3.client("s3", endpoint_url=self.moto_url, region_name="us-east-1")
        return self._client

    def new_bucket(self) -> str:
        name = f"tg-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object in ``bucket`` (read straight from moto)."""
        client = self.client()
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
        return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto server and proxy for the session, with test credentials in the environment."""
    saved = {name: os.environ.get(name) for name in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    proxy = FaultProxy(upstream=(host, port))
    proxy.up()
    try:
        yield S3Server(f"http://{host}:{port}", proxy)
    finally:
        proxy.down()
        moto.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def s3(s3_server: S3Server) -> Iterator[S3Server]:
    """The session's server with a proxy that forwards everything, up, and forgets faults after the test."""
    if s3_server.proxy._server is None:
        s3_server.proxy.up()
    s3_server.proxy.reset()
    yield s3_server
    s3_server.proxy.reset()
    if s3_server.proxy._server is None:
        s3_server.proxy.up()
