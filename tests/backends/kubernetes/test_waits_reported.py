"""A Kubernetes attempt whose pod is not running yet says what it waits for while it waits.

The lines go to the attempt's line sink (the flow run's log in production) beside the training
output: the pod, the wait so far, the bound after which the attempt ends, and what is missing, in
the cluster's own words. The first line comes sooner here than the 5 s of production
(`report_first_seconds`), so the waits can stay short.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings
from waiting import wait_for

REFUSED = ("default-scheduler says: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 "
           "nodes are available: 2 No preemption victims found for incoming pod.")


def said(lines: list[str], pattern: str) -> list[re.Match[str]]:
    return [m for line in lines if (m := re.fullmatch(pattern, line))]


def test_a_pod_the_scheduler_refuses_is_reported_with_its_words_until_the_window_ends(
        kube: KubeApi, ns: str, tmp_path: Path) -> None:
    b = KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns),
                                                     local_root=str(tmp_path), unschedulable_seconds=2.5,
                                                     report_first_seconds=0.5))
    ref = b.provision("r-refused", 1)
    lines: list[str] = []
    outcome = b.run(ref, Launch(run_id="r-refused", attempt=1, command=("python", "-c", "pass"), gpus=16),
                    on_line=lines.append)
    assert outcome.reason == "Unschedulable"
    found = said(lines, r"trainguard: waiting (\d+)s \(of 2s\) for pod (\S+) to be scheduled: (.+)")
    # after 0.5 s and 1 s (both print as 0s or 1s), then 2 s: lines at growing intervals, each with the scheduler's word
    assert len(found) >= 2 and {m[2] for m in found} == {outcome.instance}
    assert {m[3] for m in found} <= {REFUSED, "no scheduler has decided yet (schedulerName: default-scheduler)"}
    assert found[-1][3] == REFUSED and outcome.message == REFUSED.removeprefix("default-scheduler says: ")
    b.release(ref)


def test_a_pod_whose_image_cannot_be_pulled_is_reported_with_the_kubelets_words(
        kube: KubeApi, ns: str, tmp_path: Path) -> None:
    settings = JobSettings(image="registry.example.com/missing/train:9", namespace=ns)
    b = KubernetesBackend(lambda: kube, KubeSettings(settings, local_root=str(tmp_path), start_error_seconds=2.5,
                                                     report_first_seconds=0.5))
    ref = b.provision("r-pull", 1)
    lines: list[str] = []
    outcome = b.run(ref, Launch(run_id="r-pull", attempt=1, command=("python", "-c", "pass")), on_line=lines.append)
    assert outcome.reason in ("ErrImagePull", "ImagePullBackOff")
    found = said(lines, r"trainguard: waiting (\d+)s( \(of 2s\))? for pod (\S+) to start on (\S+): (.+)")
    assert found and {(m[3], m[4]) for m in found} == {(outcome.instance, outcome.node)}
    pulls = [m for m in found if m[5].startswith(("ErrImagePull: ", "ImagePullBackOff: "))]
    # a start error names its bound; the kubelet's message names the image
    assert pulls and all(m[2] == " (of 2s)" and "registry.example.com/missing/train:9" in m[5] for m in pulls)
    b.release(ref)


def test_a_job_that_creates_no_pod_is_reported_with_where_to_look(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    # parallelism 0 stands in for what holds a real Job's pods back (a ResourceQuota, an admission webhook)
    settings = JobSettings(image="python:3.11", namespace=ns, job_template={"spec": {"parallelism": 0}})
    b = KubernetesBackend(lambda: kube, KubeSettings(settings, local_root=str(tmp_path), report_first_seconds=0.3))
    ref = b.provision("r-nopod", 1)
    lines: list[str] = []
    box: list[Any] = []
    launch = Launch(run_id="r-nopod", attempt=1, command=("python", "-c", "pass"))
    thread = threading.Thread(target=lambda: box.append(b.run(ref, launch, on_line=lines.append)), daemon=True)
    thread.start()
    line = wait_for(lambda: next((x for x in lines if "to create its pods" in x), None), timeout=30,
                    what="the line about a Job without pods")
    assert re.fullmatch(rf"trainguard: waiting \d+s for the Job {ns}/{ref.name} to create its pods "
                        rf"\(`kubectl describe job -n {ns} {ref.name}` says what holds them\)", line)
    kube.delete_job(ns, ref.name)  # nothing bounds this wait but the attempt's deadline: stop it from outside
    thread.join(60)
    assert box and box[0].reason == "JobDeleted"
