"""`kubesim.run(...)`: start a cluster in a subprocess and hand tests a handle on it.

The handle knows the kubeconfig, URL and root folder, and drives the control API over HTTP
(fault rules, request log, OOM kills, evictions, node partitions). Stopping the subprocess ends
every container it started. The cluster itself lives in server.py and the controllers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kubesim.config import ImageRuntime, NodeSpec, SimConfig
from kubesim.runtime import kill_strays

START_TIMEOUT_SECONDS = 15.0
STOP_TIMEOUT_SECONDS = 10.0
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


class ControlError(RuntimeError):
    """The control API refused a request; the message is its own."""


class _Http:
    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("message", detail)
            raise ControlError(f"{method} {path}: {exc.code} {detail}") from None


class Faults:
    """sim.faults: API fault rules (see kubesim.faults.Rule for the fields)."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    def add(self, **rule: Any) -> int:
        """Add a rule, e.g. add(verb="list", resource="pods", status=503, times=2); its id."""
        return int(self._http.call("POST", "/_kubesim/faults", rule)["id"])

    def clear(self) -> None:
        self._http.call("DELETE", "/_kubesim/faults")

    def list(self) -> list[dict[str, Any]]:
        return list(self._http.call("GET", "/_kubesim/faults"))


class NodeHandle:
    """sim.node(name): node disruptions."""

    def __init__(self, http: _Http, name: str) -> None:
        self._http, self.name = http, name

    def _act(self, action: str) -> Any:
        return self._http.call("POST", f"/_kubesim/nodes/{self.name}/{action}", {})

    def partition(self) -> Any:
        return self._act("partition")

    def crash(self) -> Any:
        return self._act("crash")

    def heal(self) -> Any:
        return self._act("heal")

    def delete(self) -> Any:
        return self._act("delete")


class Sim:
    """A running cluster: what `with kubesim.run(...) as sim` yields."""

    def __init__(self, url: str, kubeconfig: Path, root: Path, process: subprocess.Popen[bytes]):
        self.url, self.kubeconfig, self.root, self.process = url, kubeconfig, root, process
        self._http = _Http(url)
        self.faults = Faults(self._http)

    def requests(self, **match: Any) -> list[dict[str, Any]]:
        """The request log, optionally only entries whose fields equal the given values."""
        log = self._http.call("GET", "/_kubesim/requests")
        return [r for r in log if all(r.get(k) == v for k, v in match.items())]

    def clear_requests(self) -> None:
        self._http.call("DELETE", "/_kubesim/requests")

    def oom_kill(self, namespace: str, pod: str, container: str | None = None) -> Any:
        return self._http.call("POST", f"/_kubesim/pods/{namespace}/{pod}/oom-kill",
                               {"container": container})

    def evict(self, namespace: str, pod: str, resource: str = "memory") -> Any:
        """Node-pressure eviction by the kubelet (not the Eviction API)."""
        return self._http.call("POST", f"/_kubesim/pods/{namespace}/{pod}/evict",
                               {"resource": resource})

    def preempt(self, namespace: str, pod: str, grace_seconds: int | None = None) -> Any:
        return self._http.call("POST", f"/_kubesim/pods/{namespace}/{pod}/preempt",
                               {"grace_seconds": grace_seconds})

    def node(self, name: str) -> NodeHandle:
        return NodeHandle(self._http, name)

    def outage(self, seconds: float) -> None:
        """Close the API port for `seconds` (connections refused, open ones cut), then reopen.

        Returns once the port is closed; it reopens in the background.
        """
        self._http.call("POST", "/_kubesim/outage", {"seconds": seconds})

    def compact(self) -> None:
        """Forget the watch history: any older resourceVersion now answers 410."""
        self._http.call("POST", "/_kubesim/compact", {})

    @property
    def in_cluster_url(self) -> str:
        """The HTTPS endpoint pods reach through KUBERNETES_SERVICE_HOST/PORT."""
        return str(json.loads((self.root / "in-cluster.json").read_text())["url"])

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses (kubectl, workers) pointing at this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}


def spawn(config: SimConfig) -> subprocess.Popen[bytes]:
    """Start a server for config in a session of its own (a terminal's Ctrl-C is not its):
    it writes `kubeconfig` and logs to `kubesim.log` in config.root."""
    config_file, kubeconfig = config.root / "kubesim.json", config.root / "kubeconfig"
    config_file.write_text(config.to_json())
    kubeconfig.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)}
    with (config.root / "kubesim.log").open("ab") as log_fh:
        return subprocess.Popen(
            [sys.executable, "-m", "kubesim", "serve", "--port", "0", "--config",
             str(config_file), "--kubeconfig", str(kubeconfig)],
            stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)


def wait_ready(process: subprocess.Popen[bytes], kubeconfig: Path, log: Path) -> str:
    """The server's URL once it answers /readyz; RuntimeError with its log's tail if it exits."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"kubesim server exited with {process.returncode}:\n{tail}")
        if kubeconfig.exists():
            url = next(line.split("server:", 1)[1].strip()
                       for line in kubeconfig.read_text().splitlines() if "server:" in line)
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/readyz", timeout=2) as response:
                    if response.status == 200:
                        return url
        time.sleep(0.02)
    raise RuntimeError(f"kubesim server not ready after {START_TIMEOUT_SECONDS}s; see {log}")


def child_groups(pid: int) -> set[int]:
    """Process groups of pid's children: the containers, each in its own session."""
    groups: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            groups.add(int(fields[2]))
    return groups


def _stop(process: subprocess.Popen[bytes], root: Path, log: Path) -> None:
    containers = child_groups(process.pid)
    started = time.monotonic()
    outcome = f"had already exited with {process.poll()}"
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            outcome = f"exited with {process.wait(STOP_TIMEOUT_SECONDS)}"
        except subprocess.TimeoutExpired:
            outcome = "did not stop: killed"
    with log.open("a") as fh:
        fh.write(f"fixture: server {outcome} after {time.monotonic() - started:.2f}s\n")
    # The server runs in its own session and its containers in theirs: whatever a clean stop
    # left behind (a server that had to be killed) dies here.
    for group in {process.pid, *containers}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    kill_strays(str(root / "pods"))  # container descendants that left their process group
    process.wait()


@contextlib.contextmanager
def run(root: Path | str | None = None, nodes: Iterable[NodeSpec] | None = None,
        images: Mapping[str, ImageRuntime] | None = None, time_scale: float = 1.0,
        history: int = 10000, grace_scale: float | None = None) -> Iterator[Sim]:
    """Start a cluster on a free loopback port; stop it and its containers on exit.

    Args:
        root: folder for logs, volumes and the kubeconfig; a temporary one (removed at the end)
            when None.
        nodes: the simulated nodes (default: one node "node-1" without GPUs).
        images: image glob -> HostPython/Host runtime (default: run commands on the host).
        time_scale: factor for internal delays (back-offs, grace periods, node timeouts).
        history: how many changes watches can resume from.
        grace_scale: factor for pods' termination grace periods (default: time_scale).
    """
    owned = root is None
    base = Path(tempfile.mkdtemp(prefix="kubesim-")) if root is None else Path(root)
    base.mkdir(parents=True, exist_ok=True)
    config = SimConfig(root=base, nodes=tuple(nodes) if nodes else (NodeSpec("node-1"),),
                       images=dict(images or {}), time_scale=time_scale, history=history,
                       grace_scale=grace_scale)
    process = spawn(config)
    kubeconfig, log = base / "kubeconfig", base / "kubesim.log"
    try:
        url = wait_ready(process, kubeconfig, log)
        yield Sim(url, kubeconfig, base, process)
    finally:
        _stop(process, base, log)
        if owned:
            shutil.rmtree(base, ignore_errors=True)
