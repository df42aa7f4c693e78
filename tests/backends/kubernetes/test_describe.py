"""The describe text against kubectl itself: a failed pod and a restarted one, line by line.

kubectl is the independent judge (it is installed on the test machines and CI installs it as an OS
package); the only differences allowed are event ages (kubectl runs a moment later).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from evidence_helpers import job_failed, pods_of

import kubesim.fixture
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.describe import describe_pod
from trainguard.core.backends.kubernetes.gotext import human_duration, tabwrite
from waiting import wait_for

_AGE = re.compile(r"^(\S+ \S+ )(\S+(?: \(x\d+ over \S+\))?)( .*)$")


def _normalised(text: str) -> list[str]:
    lines, in_events = [], False
    for raw in text.splitlines():
        line = " ".join(raw.split())
        in_events = in_events or line.startswith("Events:")
        if in_events and (match := _AGE.match(line)) and not line.startswith(("Type ", "---- ")):
            line = f"{match.group(1)}AGE{match.group(3)}"
        lines.append(line)
    return lines


def _assert_same_as_kubectl(sim: kubesim.fixture.Sim, kube: KubeApi, ns: str, pod: str) -> str:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed as the oracle: ./dev test installs it"
    events = kube.list_events(ns, field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}")["items"]
    ours = describe_pod(kube.read_pod(ns, pod), events)
    theirs = subprocess.run([kubectl, "describe", "pod", "-n", ns, pod], env=sim.env, capture_output=True,
                            text=True, timeout=30, check=True).stdout
    assert _normalised(ours) == _normalised(theirs)
    return ours


def _job(name: str, restart: str, main: str, init: str, *sidecars: dict[str, Any]) -> dict[str, Any]:
    spec = {
        "restartPolicy": restart, "terminationGracePeriodSeconds": 1, "nodeSelector": {"gpu": "yes"},
        "initContainers": [{"name": "prep", "image": "python:3.11", "command": ["python", "-c", init]},
                           *sidecars],
        "containers": [{
            "name": "train", "image": "ghcr.io/acme/train:1", "command": ["python", "-c", main],
            "args": ["--epochs", "3"], "ports": [{"containerPort": 29500}],
            "resources": {"limits": {"memory": "1Gi", "nvidia.com/gpu": "1"}, "requests": {"cpu": "500m"}},
            "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "EPOCHS", "value": "3"}],
            "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}, {"name": "shm", "mountPath": "/dev/shm"}]}],
        "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": f"{name}-ckpt"}},
                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}],
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {"team": "vision"}},
            "spec": {"backoffLimit": 2, "template": {"metadata": {"labels": {"team": "vision"}}, "spec": spec}}}


@pytest.fixture(scope="module")
def gpu_label(kube: KubeApi) -> None:
    """kubesim's nodes take a label the Jobs select, as a GPU pool's nodes would."""
    for node in ("gpu-node-1", "gpu-node-2"):
        kube.core.patch_node(node, {"metadata": {"labels": {"gpu": "yes"}}})


def test_describe_of_a_failed_pod_matches_kubectl(
    sim: kubesim.fixture.Sim, kube: KubeApi, ns: str, gpu_label: None,
) -> None:
    segv = "import os, signal; print('nan at step 7', flush=True); os.kill(os.getpid(), signal.SIGSEGV)"
    kube.create_job(ns, _job("crash", "Never", segv, "print('ready')"))
    wait_for(lambda: job_failed(kube, ns, "crash"), timeout=30, what="the Job to fail")
    pod = pods_of(kube, ns, "crash")[0]["metadata"]["name"]

    text = _assert_same_as_kubectl(sim, kube, ns, pod)

    assert re.search(r"Status:\s+Failed", text) and f"Name:             {pod}" in text
    assert re.search(r"State:\s+Terminated\n\s+Reason:\s+Error\n\s+Exit Code:\s+139\n\s+Signal:\s+11", text)
    assert "Controlled By:  Job/crash" in text and "Started container train" in text


def test_describe_of_a_restarted_pod_matches_kubectl_with_its_last_state(
    sim: kubesim.fixture.Sim, kube: KubeApi, ns: str, gpu_label: None, tmp_path: Any,
) -> None:
    marker = str(tmp_path / "crashed-once")
    flaky = (f"import os, sys, time\nfirst = not os.path.exists({marker!r})\nopen({marker!r}, 'a').close()\n"
             "sys.exit(3) if first else time.sleep(60)\n")
    # a native sidecar (restartable init container) beside it, as a log shipper would run
    shipper = {"name": "shipper", "image": "python:3.11", "restartPolicy": "Always",
               "command": ["python", "-c", "import time; print('shipping', flush=True); time.sleep(60)"]}
    kube.create_job(ns, _job("flaky", "OnFailure", flaky, "print('ready')", shipper))

    def running_again() -> str | None:
        for p in pods_of(kube, ns, "flaky"):
            status = ((p.get("status") or {}).get("containerStatuses") or [{}])[0]
            if status.get("restartCount") == 1 and "running" in (status.get("state") or {}):
                return str(p["metadata"]["name"])
        return None

    pod = wait_for(running_again, timeout=30, what="the container running again after a crash")
    text = _assert_same_as_kubectl(sim, kube, ns, pod)
    assert re.search(r"Last State:\s+Terminated\n\s+Reason:\s+Error\n\s+Exit Code:\s+3", text)
    assert re.search(r"Restart Count:\s+1", text)
    assert re.search(r"  shipper:\n(    .*\n)*?    State:\s+Running\n", text)  # listed with the init containers
    kube.delete_job(ns, "flaky")


def test_control_characters_and_secrets_do_not_reach_the_text() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    pod = {"metadata": {"name": "p\x1b[31m", "namespace": "ns"},
           "spec": {"containers": [{"name": "c", "image": "i", "args": ["--api-key=abc"],
                                    "env": [{"name": "DB_PASSWORD", "value": "hunter2"}]}]},
           "status": {"phase": "Failed"}}
    event = {"type": "Warning", "reason": "Failed", "count": 3, "source": {"component": "kubelet"},
             "message": "pull https://u:tok3n@registry/x\x07\ninjected",
             "firstTimestamp": (now - timedelta(minutes=5)).isoformat(), "lastTimestamp": now.isoformat()}
    text = describe_pod(pod, [event], now=now)
    assert "\x1b" not in text and "\x07" not in text and "hunter2" not in text and "abc" not in text
    assert "tok3n" not in text and "0s (x3 over 5m)" in text and "p\\x1b[31m" in text


@pytest.mark.parametrize(("seconds", "shown"), [
    (-5, "<invalid>"), (59, "59s"), (119, "119s"), (150, "2m30s"), (600, "10m"), (3 * 3600 + 60, "3h1m"),
    (30 * 3600, "30h"), (3 * 86400 + 3600, "3d1h"), (40 * 86400, "40d"), (800 * 86400, "2y70d"),
])
def test_ages_read_as_kubectl_prints_them(seconds: int, shown: str) -> None:
    assert human_duration(seconds) == shown


def test_columns_align_per_block_as_go_tabwriter_does() -> None:
    assert tabwrite(["a:\tx", "long name:\ty", "break", "b:\tz"]) == "a:          x\nlong name:  y\nbreak\nb:  z\n"
