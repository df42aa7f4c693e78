"""kubectl as an independent judge: get, describe, logs --previous, get events and wait against
real Jobs whose containers run as local processes under kubesim's controllers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import kubectl
from kubernetes import client
from waiting import wait_for

# First attempt prints and exits 1; later attempts (the marker file exists) stay up.
_FLAKY = ("import os, sys, time\n"
          "marker = sys.argv[1]\n"
          "first = not os.path.exists(marker)\n"
          "open(marker, 'a').close()\n"
          "print('attempt first' if first else 'attempt again', flush=True)\n"
          "sys.exit(1) if first else time.sleep(60)\n")


def _job(name: str, script: str, *args: str, restart: str = "Never",
         backoff: int = 0) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": backoff, "template": {"spec": {
                "restartPolicy": restart, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "train", "image": "ghcr.io/acme/train:1",
                                "command": ["python", "-c", script, *args]}]}}}}


@pytest.fixture
def restarted(sim: Any, batch: client.BatchV1Api, core: client.CoreV1Api, ns: str,
              tmp_path: Path) -> str:
    """A pod of an OnFailure job whose first container exited 1 and was restarted."""
    batch.create_namespaced_job(ns, _job("flaky", _FLAKY, str(tmp_path / "marker"),
                                         restart="OnFailure", backoff=5))

    def running_again() -> str | None:
        for pod in core.list_namespaced_pod(ns, label_selector="job-name=flaky").items:
            status = (pod.status.container_statuses or [None])[0]
            if status and status.restart_count >= 1 and status.state.running:
                return str(pod.metadata.name)
        return None

    return str(wait_for(running_again, what="the restarted pod running"))


def test_kubectl_get_pods_shows_restarts_and_status(sim: Any, ns: str, restarted: str) -> None:
    out = kubectl(sim, "get", "pods", "-n", ns).stdout.splitlines()
    assert out[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    row = out[1].split()
    assert row[0] == restarted and row[1] == "1/1" and row[2] == "Running"
    # RESTARTS reads "1 (0s ago)": the count, then the age of the last termination.
    assert row[3] == "1" and row[4].startswith("(") and row[5] == "ago)"


def test_kubectl_logs_previous_reads_the_crashed_instance(sim: Any, ns: str,
                                                          restarted: str) -> None:
    assert kubectl(sim, "logs", "--previous", "-n", ns, restarted).stdout == "attempt first\n"
    current = wait_for(lambda: kubectl(sim, "logs", "-n", ns, restarted).stdout, what="its log")
    assert current == "attempt again\n"


def test_kubectl_describe_pod_shows_last_state_and_events(sim: Any, ns: str,
                                                          restarted: str) -> None:
    out = kubectl(sim, "describe", "pod", "-n", ns, restarted).stdout
    assert "Controlled By:  Job/flaky" in out
    assert "Last State:     Terminated" in out and "Exit Code:    1" in out
    assert "Restart Count:  1" in out
    assert "Successfully assigned" in out and "Started container train" in out


def test_kubectl_get_events_lists_kubelet_and_job_events(sim: Any, ns: str,
                                                         restarted: str) -> None:
    out = kubectl(sim, "get", "events", "-n", ns).stdout
    assert out.splitlines()[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert "SuccessfulCreate" in out and f"pod/{restarted}" in out and "BackOff" in out
    selected = kubectl(sim, "get", "events", "-n", ns, "--field-selector",
                       "reason=SuccessfulCreate").stdout
    assert len(selected.splitlines()) == 2 and "job/flaky" in selected


def test_kubectl_wait_for_failed_job_returns_when_the_job_fails(sim: Any, ns: str,
                                                                batch: client.BatchV1Api) -> None:
    batch.create_namespaced_job(ns, _job("doomed", "import sys; print('bye'); sys.exit(3)"))
    done = kubectl(sim, "wait", "--for=condition=failed", "job/doomed", "-n", ns,
                   "--timeout=30s")
    assert done.stdout.strip() == "job.batch/doomed condition met"
    jobs = kubectl(sim, "get", "jobs", "-n", ns).stdout.splitlines()
    assert jobs[1].split()[:3] == ["doomed", "Failed", "0/1"]
    pods = kubectl(sim, "get", "pods", "-n", ns, "-l", "job-name=doomed").stdout
    assert "Error" in pods


def test_kubectl_get_nodes_shows_the_simulated_nodes(sim: Any) -> None:
    out = kubectl(sim, "get", "nodes").stdout.splitlines()
    names = [line.split()[0] for line in out[1:]]
    assert names == ["node-1", "node-2"]
    assert all(line.split()[1] == "Ready" for line in out[1:])


_CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  labels: {{{labels}}}\ndata:\n{data}"


def test_kubectl_apply_creates_then_three_way_merges(sim: Any, ns: str) -> None:
    first = _CM.format(labels="a: '1'", data="  one: '1'\n  two: '2'\n")
    second = _CM.format(labels="b: '2'", data="  one: '3'\n")
    assert "configmap/c created" in kubectl(sim, "apply", "-n", ns, "-f", "-",
                                            stdin=first).stdout
    assert "configmap/c configured" in kubectl(sim, "apply", "-n", ns, "-f", "-",
                                               stdin=second).stdout
    out = kubectl(sim, "get", "cm", "c", "-n", ns, "-o",
                  "jsonpath={.data} {.metadata.labels}").stdout
    assert out == '{"one":"3"} {"b":"2"}'


def test_kubectl_apply_server_side_creates_the_object(sim: Any, ns: str) -> None:
    manifest = _CM.format(labels="a: '1'", data="  one: '1'\n")
    done = kubectl(sim, "apply", "--server-side", "-n", ns, "-f", "-", stdin=manifest)
    assert "configmap/c serverside-applied" in done.stdout
    assert kubectl(sim, "get", "cm", "c", "-n", ns, "-o", "jsonpath={.data.one}").stdout == "1"


def test_kubectl_generators_sending_protobuf_get_a_clear_415(sim: Any, ns: str) -> None:
    done = kubectl(sim, "create", "configmap", "g", "-n", ns, "--from-literal=a=b",
                   check=False)
    assert done.returncode == 1
    assert "the body of the request was in an unknown format" in done.stderr
