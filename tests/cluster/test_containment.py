"""What a cluster does with what a container writes and mounts, judged by the official client.

Oracles, from Kubernetes' documentation and source:

- containerd writes a log line longer than `max_container_log_line_size` (16 KiB by default), and
  the part of a line written so far, as partial (`P`) CRI records; the kubelet's log endpoint joins
  them, so `kubectl logs -f` shows a progress bar that never prints a newline as it grows.
- `volumeMounts[].subPath` must be a relative path without `..` (apiserver validation,
  `validateLocalDescendingPath`); the kubelet creates a missing subPath folder, and refuses to start
  a container whose subPath resolves outside its volume through a symlink
  (CVE-2017-1002101: `CreateContainerConfigError`).
- A namespaced dependent (a Secret) names its owner (a Job) in `ownerReferences`; the garbage
  collector deletes it once the owner is deleted with Background propagation, and strips the
  reference, keeping the dependent, under Orphan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_scenarios_disruptions import phase, pod
from test_scenarios_jobs import pod_log

import kubesim
from kubesim import logs, runtime
from waiting import wait_for

PROGRESS = ("import sys, time\n"
            "for i in range(4000):\n"
            "    sys.stdout.write('\\rprogress %05d' % i)\n"
            "sys.stdout.flush()\n"
            "time.sleep(120)\n")


def test_a_line_without_a_newline_is_served_while_it_is_written(
        sim: kubesim.fixture.Sim, core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("bar", PROGRESS, grace=0))
    phase(core, ns, "bar", "Running")
    shown = wait_for(lambda: (text := pod_log(core, ns, "bar")).count("progress") >= 3000 and text,
                     what="the unfinished progress line in the log")
    assert shown.startswith("\rprogress 00000\rprogress 00001") and "\n" not in shown
    records = [logs.parse_line(line) for line in _cri_records(sim, ns, "bar")]
    assert records and all(r is not None and r[2] for r in records)  # every record partial so far
    assert {len(r[3].encode()) for r in records if r} == {runtime.MAX_LOG_LINE_BYTES}
    core.delete_namespaced_pod("bar", ns, grace_period_seconds=0)


def _cri_records(sim: kubesim.fixture.Sim, ns: str, name: str) -> list[str]:
    found = sorted(Path(sim.root).rglob(f"pods/{ns}_{name}_*/train/0.log"))
    assert found, f"no CRI log of {ns}/{name} under {sim.root}"
    return logs.records(found[0].read_bytes().decode(errors="replace"))


@pytest.mark.parametrize(("sub_path", "message"), [
    ("../other-run", "must not contain '..'"), ("runs/../../etc", "must not contain '..'"),
    ("/etc", "must be a relative path"),
])
def test_a_sub_path_that_is_absolute_or_climbs_is_refused(core: client.CoreV1Api, ns: str, sub_path: str,
                                                          message: str) -> None:
    body = _mounting("climb", "print(1)", sub_path)
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(ns, body)
    assert refused.value.status == 422
    assert f'spec.containers[0].volumeMounts[0].subPath: Invalid value: "{sub_path}": {message}' in json.loads(
        refused.value.body)["message"]


def test_a_sub_path_mount_shows_the_container_only_that_folder_of_the_volume(
        sim: kubesim.fixture.Sim, core: client.CoreV1Api, ns: str) -> None:
    volume = Path(sim.root) / "pvc" / ns / "shared"
    (volume / "runs" / "a").mkdir(parents=True)
    (volume / "runs" / "a" / "raw.log").write_text("other run's secret")
    code = ("import os\nopen('/mnt/mine/written', 'w').write('x')\n"
            "print(sorted(os.listdir('/mnt/mine')), os.path.exists('/mnt/a/raw.log'))")
    core.create_namespaced_pod(ns, _mounting("narrow", code, "runs/b/attempt-1"))
    phase(core, ns, "narrow", "Succeeded")
    assert pod_log(core, ns, "narrow") == "['written'] False\n"
    assert (volume / "runs" / "b" / "attempt-1" / "written").read_text() == "x"  # the kubelet made the folder


def test_a_sub_path_a_symlink_leads_out_of_the_volume_fails_the_container(
        sim: kubesim.fixture.Sim, core: client.CoreV1Api, ns: str, tmp_path: Path) -> None:
    volume = Path(sim.root) / "pvc" / ns / "shared"
    (volume / "runs").mkdir(parents=True)
    (tmp_path / "host-secret").write_text("host")
    (volume / "runs" / "b").symlink_to(tmp_path)  # planted by another pod that mounts the whole volume
    core.create_namespaced_pod(ns, _mounting("escape", "print(open('/mnt/mine/host-secret').read())", "runs/b"))

    def waiting() -> Any:
        statuses = core.read_namespaced_pod("escape", ns).status.container_statuses
        found = statuses[0].state.waiting if statuses else None
        return found if found and found.reason != "ContainerCreating" else None
    found = wait_for(waiting, what="a waiting state")
    assert (found.reason, found.message) == (
        "CreateContainerConfigError", 'failed to prepare subPath for volumeMount "data" of container "train"')


def _mounting(name: str, code: str, sub_path: str) -> dict[str, Any]:
    body = pod(name, code, grace=0, volumeMounts=[{"name": "data", "mountPath": "/mnt/mine", "subPath": sub_path}])
    body["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}]
    return body
