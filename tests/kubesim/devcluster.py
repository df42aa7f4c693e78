"""The cluster `./dev kubesim` and `./dev kubesim-run` give a user: one kubesim per checkout.

`python -m kubesim.devcluster start|stop|status|evict|fail-node|evict-after-checkpoint`.
The cluster: two nodes with 2 `nvidia.com/gpu` each; every image runs its command on this host
with the checkout's Python standing in for python/python3 and the checkout as the image's
WORKDIR (as an image built with `WORKDIR` on the training code), so `examples/ddp/train.py`
resolves in a pod as it does here. Its server runs in a session of its own, so a Ctrl-C in
the terminal reaches `trainguard run` and not the cluster under it. What is running is recorded
in `.kubesim/current` of the checkout, which every verb reads.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubesim import fixture
from kubesim.config import HostPython, NodeSpec, SimConfig
from kubesim.runtime import kill_strays

NODES = (NodeSpec("gpu-node-1", gpus=2), NodeSpec("gpu-node-2", gpus=2))
STOP_TIMEOUT_SECONDS = 15.0
SAY_FIRST_SECONDS = 5.0
CHECKPOINTS_CLAIM = "trainguard-checkpoints"
_TESTS = Path(__file__).resolve().parent.parent


class Failure(Exception):
    """One line for the user, printed as `kubesim: <line>`."""


def _say(text: str) -> None:
    print(f"kubesim: {text}", flush=True)


def _state_file(checkout: Path) -> Path:
    return checkout / ".kubesim" / "current"


def _current(checkout: Path) -> dict[str, Any] | None:
    """The running cluster's record, or None (a record whose server is gone is dropped)."""
    path = _state_file(checkout)
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if _alive(int(state["pid"]), state["root"]):
        return state
    path.unlink(missing_ok=True)
    return None


def _alive(pid: int, root: str) -> bool:
    """Whether pid is still that kubesim server (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kubesim" in cmdline and any(root.encode() in arg for arg in cmdline)


def _wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """Poll check until it gives a truthy value, saying what it waits for now and then."""
    start = time.monotonic()
    say_at = SAY_FIRST_SECONDS
    while True:
        found = check()
        if found:
            return found
        waited = time.monotonic() - start
        if waited > timeout:
            raise Failure(f"gave up after {timeout:.0f} s waiting for {what}")
        if waited >= say_at:  # at growing intervals: 5 s, 10 s, 20 s, 40 s, ...
            _say(f"still waiting for {what} ({waited:.0f} s)")
            say_at *= 2
        time.sleep(0.1)


def folder(checkout: Path) -> Path:
    """The checkout's cluster folder: one per checkout, kept across restarts. The claims' folders under
    pvc/ outlive the server as a cluster's volumes outlive its pods, so a stopped run resumes from its
    checkpoints."""
    digest = hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"kubesim-{digest}"


def start(checkout: Path) -> dict[str, Any]:
    """Start the checkout's cluster unless one runs; its record."""
    running = _current(checkout)
    if running is not None:
        _say(f"already running: KUBECONFIG={running['kubeconfig']}")
        return running
    root = folder(checkout)
    root.mkdir(exist_ok=True)
    config = SimConfig(root=root, nodes=NODES,
                       images={"*": HostPython(sys.executable, workdir=str(checkout))},
                       time_scale=0.1)
    kubeconfig, log = root / "kubeconfig", root / "kubesim.log"
    _say("starting: waiting for the server to answer")
    server = fixture.spawn(config)  # in a session of its own: a Ctrl-C in the terminal is not its
    try:
        url = fixture.wait_ready(server, kubeconfig, log)
    except BaseException as exc:  # a Ctrl-C or a failed start: no server is left behind unrecorded
        server.terminate()
        server.wait(STOP_TIMEOUT_SECONDS)
        if isinstance(exc, RuntimeError):
            raise Failure(str(exc).splitlines()[0] + f" (see {log})") from None
        raise
    state = {"pid": server.pid, "root": str(root), "kubeconfig": str(kubeconfig),
             "log": str(log), "url": url}
    path = _state_file(checkout)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(state))
    _say(f"started: 2 nodes (gpu-node-1, gpu-node-2; 2 nvidia.com/gpu each), pods start in "
         f"{checkout} (log: {log})")
    _say(f"KUBECONFIG={kubeconfig}")
    return state


def stop(checkout: Path) -> None:
    state = _current(checkout)
    if state is None:
        _say("none running")
        return
    pid, root = int(state["pid"]), Path(state["root"])
    containers = fixture.child_groups(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    try:
        _wait(f"the server (pid {pid}) to stop its containers and exit",
              lambda: not _alive(pid, str(root)), STOP_TIMEOUT_SECONDS)
    finally:  # whatever a clean stop left behind (a server that had to be killed) dies here
        for group in {pid, *containers}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        kill_strays(str(root / "pods"))
    _state_file(checkout).unlink(missing_ok=True)
    _say(f"stopped; its folder stays, volumes (pvc/) included, for a look or a --resume: "
         f"{state['root']}")


def _running(checkout: Path) -> dict[str, Any]:
    state = _current(checkout)
    if state is None:
        raise Failure("none running: start one with ./dev kubesim start "
                      "(or ./dev kubesim-run SPEC --keep)")
    return state


def _control(state: dict[str, Any], path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(state["url"] + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError):
            detail = json.loads(detail).get("message", detail)
        raise Failure(f"{path}: {exc.code} {detail}") from None


def _get(state: dict[str, Any], path: str) -> Any:
    with urllib.request.urlopen(state["url"] + path, timeout=30) as response:
        return json.loads(response.read())


def evict(checkout: Path, namespace: str, pod: str) -> None:
    """A node-pressure eviction of the pod, as the kubelet does it (DisruptionTarget)."""
    _control(_running(checkout), f"/_kubesim/pods/{namespace}/{pod}/evict")
    _say(f"evicted pod {namespace}/{pod} (node-pressure eviction: DisruptionTarget, "
         "reason Evicted)")


def fail_node(checkout: Path, node: str) -> None:
    """The node crashes: its containers die, it goes NotReady, its pods fail."""
    _control(_running(checkout), f"/_kubesim/nodes/{node}/crash")
    _say(f"node {node} crashed: NotReady, its pods are lost; ./dev kubesim heal-node {node} "
         "brings it back")


def heal_node(checkout: Path, node: str) -> None:
    _control(_running(checkout), f"/_kubesim/nodes/{node}/heal")
    _say(f"node {node} healed: Ready again")


def _running_pod(state: dict[str, Any], index: str) -> dict[str, Any] | None:
    selector = urllib.parse.quote(
        f"trainguard.io/attempt,batch.kubernetes.io/job-completion-index={index}")
    pods = _get(state, f"/api/v1/pods?labelSelector={selector}")["items"]
    for pod in pods:
        if (pod.get("status") or {}).get("phase") == "Running":
            return dict(pod)
    return None


def evict_after_checkpoint(checkout: Path, index: str) -> None:
    """Once a training run writes a checkpoint (one the cluster did not hold before), evict
    the running pod of that completion index."""
    state = _running(checkout)
    claims = Path(state["root"]) / "pvc"

    def checkpoints() -> set[Path]:  # dot-names (a save in progress, the helper's acks) are no checkpoint
        return {p for p in claims.glob(f"*/{CHECKPOINTS_CLAIM}/*/*") if not p.name.startswith(".")}

    before = checkpoints()
    checkpoint = _wait("a training run's first checkpoint",
                       lambda: next(iter(sorted(checkpoints() - before)), None), 3600)
    pod = _wait(f"a running pod of completion index {index}",
                lambda: _running_pod(state, index), 600)
    meta = pod["metadata"]
    _say(f"first checkpoint {checkpoint.name} written: evicting pod {meta['name']}")
    evict(checkout, meta["namespace"], meta["name"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev kubesim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=Path.cwd(), help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("start", help="start this checkout's cluster and print its KUBECONFIG")
    sub.add_parser("stop", help="stop it (its containers with it)")
    sub.add_parser("status", help="KUBECONFIG=... of the running one, or exit 1")
    one = sub.add_parser("evict", help="evict a pod as node pressure does (a retryable preemption)")
    one.add_argument("pod")
    one.add_argument("-n", "--namespace", default="default")
    node = sub.add_parser("fail-node", help="crash a node: NotReady, its pods lost")
    node.add_argument("node")
    heal = sub.add_parser("heal-node", help="bring a crashed node back")
    heal.add_argument("node")
    later = sub.add_parser("evict-after-checkpoint",
                           help="wait for a run's first checkpoint, then evict a running pod")
    later.add_argument("--index", default="1", help="the pod's completion index (default 1)")
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    try:
        if args.verb == "start":
            start(checkout)
        elif args.verb == "stop":
            stop(checkout)
        elif args.verb == "status":
            state = _current(checkout)
            if state is None:
                _say("none running")
                return 1
            print(f"KUBECONFIG={state['kubeconfig']}")
        elif args.verb == "evict":
            evict(checkout, args.namespace, args.pod)
        elif args.verb == "fail-node":
            fail_node(checkout, args.node)
        elif args.verb == "heal-node":
            heal_node(checkout, args.node)
        else:
            evict_after_checkpoint(checkout, args.index)
    except Failure as exc:
        print(f"kubesim: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
