"""Native sidecars (init containers with restartPolicy Always) on the simulated kubelet.

Each scenario runs real processes: the sidecar crashes, is restarted, keeps its previous log,
and is stopped once the regular containers are done, as the kubelet does since Kubernetes 1.29.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster_helpers import read_log
from kubernetes import client
from waiting import wait_for

IMAGE = "python:3.11"

# First instance: a line, a marker, exit 1. Later instances: a line, a marker, then run until
# stopped (SIGTERM ends python with 143), or, with `trap`, exit 0 on SIGTERM, noting whether the
# regular container had ended by then.
SIDECAR = """
import pathlib, signal, sys, time
folder = pathlib.Path(sys.argv[1])
if not (folder / 'crashed').exists():
    print('shipper: first instance, crashing', flush=True)
    (folder / 'crashed').touch()
    sys.exit(1)
def stop(*_):
    (folder / 'train-ended-first').write_text(str((folder / 'train-ended').exists()))
    sys.exit(0)
if sys.argv[2:] == ['trap']:
    signal.signal(signal.SIGTERM, stop)
print('shipper: up again', flush=True)
(folder / 'up').touch()
while True:
    time.sleep(0.05)
"""
# The regular container waits for the sidecar's second instance, then for the test's go-ahead.
TRAIN = """
import pathlib, signal, sys, time
folder = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: ((folder / 'train-ended').touch(), sys.exit(143)))
while not (folder / 'up').exists() or not (folder / 'go').exists():
    time.sleep(0.02)
print('trained', flush=True)
sys.exit(int(sys.argv[2]))
"""


def pod(name: str, folder: Path, *, exit_code: int = 0, trap: bool = False,
        grace: int = 5) -> dict[str, Any]:
    sidecar = {"name": "shipper", "image": IMAGE, "restartPolicy": "Always",
               "command": ["python", "-c", SIDECAR, str(folder), *(["trap"] if trap else [])]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
        "initContainers": [sidecar],
        "containers": [{"name": "train", "image": IMAGE,
                        "command": ["python", "-c", TRAIN, str(folder), str(exit_code)]}]}}


def statuses(p: client.V1Pod) -> tuple[client.V1ContainerStatus, client.V1ContainerStatus]:
    return p.status.init_container_statuses[0], p.status.container_statuses[0]


def condition(p: client.V1Pod, ctype: str) -> str:
    return str(next(c.status for c in p.status.conditions if c.type == ctype))


def test_a_crashed_sidecar_is_restarted_beside_the_main_container_with_its_previous_log_kept(
        core: client.CoreV1Api, ns: str, tmp_path: Path) -> None:
    core.create_namespaced_pod(ns, pod("side", tmp_path))

    def both_running() -> client.V1Pod | None:
        p = core.read_namespaced_pod("side", ns)
        init = p.status.init_container_statuses
        main = p.status.container_statuses
        return p if (init and init[0].restart_count and init[0].state.running
                     and main[0].state.running) else None

    running = wait_for(both_running, what="sidecar restarted and train running")
    sidecar, train = statuses(running)
    assert (sidecar.restart_count, sidecar.started, sidecar.ready) == (1, True, True)
    assert (sidecar.last_state.terminated.exit_code, sidecar.last_state.terminated.reason) == (
        1, "Error")
    assert running.status.phase == "Running"
    assert [condition(running, c) for c in ("Initialized", "ContainersReady", "Ready")] == [
        "True"] * 3
    assert read_log(core, "side", ns, container="shipper", previous=True) == (
        "shipper: first instance, crashing\n")
    wait_for(lambda: read_log(core, "side", ns, container="shipper") == "shipper: up again\n",
             what="the second instance's line in its log")

    (tmp_path / "go").touch()  # train ends with 0 while the sidecar still runs
    done = wait_for(lambda: (p := core.read_namespaced_pod("side", ns)).status.phase
                    in ("Succeeded", "Failed") and p, what="the pod to end")
    sidecar, train = statuses(done)
    assert done.status.phase == "Succeeded"
    assert (train.state.terminated.exit_code, sidecar.state.terminated.exit_code) == (0, 143)
    assert (sidecar.started, sidecar.ready, sidecar.restart_count) == (False, False, 1)
    assert train.state.terminated.finished_at <= sidecar.state.terminated.finished_at
    assert read_log(core, "side", ns, container="shipper", previous=True) == (
        "shipper: first instance, crashing\n")
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=side").items
    assert [e.message for e in events if e.reason == "Killing"] == ["Stopping container shipper"]


def test_the_regular_containers_alone_decide_the_phase_of_a_pod_with_a_sidecar(
        core: client.CoreV1Api, ns: str, tmp_path: Path) -> None:
    (tmp_path / "go").touch()
    core.create_namespaced_pod(ns, pod("fails", tmp_path, exit_code=3, trap=True))
    done = wait_for(lambda: (p := core.read_namespaced_pod("fails", ns)).status.phase
                    in ("Succeeded", "Failed") and p, what="the pod to end")
    sidecar, train = statuses(done)
    # the sidecar ended cleanly on SIGTERM: the regular container's 3 fails the pod all the same
    assert (done.status.phase, train.state.terminated.exit_code) == ("Failed", 3)
    assert (sidecar.state.terminated.exit_code, sidecar.state.terminated.reason) == (0, "Completed")


def test_deleting_a_pod_stops_its_regular_container_before_its_sidecar(
        core: client.CoreV1Api, ns: str, tmp_path: Path) -> None:
    core.create_namespaced_pod(ns, pod("deleted", tmp_path, trap=True, grace=30))  # 0.6 s scaled
    wait_for(lambda: (tmp_path / "up").exists() and core.read_namespaced_pod(
        "deleted", ns).status.container_statuses[0].state.running, what="sidecar and train running")
    core.delete_namespaced_pod("deleted", ns)
    order = wait_for(lambda: (tmp_path / "train-ended-first").exists()
                     and (tmp_path / "train-ended-first").read_text(), what="the sidecar's SIGTERM")
    assert order == "True"
    wait_for(lambda: not core.list_namespaced_pod(ns).items, what="the pod to go")
