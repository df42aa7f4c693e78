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

import base64
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
