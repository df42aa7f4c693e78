"""KubernetesBackend with an attempt of two nodes against kubesim, without Prefect: the Indexed Job
and its Service as the cluster sees them, real torchrun over gloo across the two pods, the live log
of both, the survivors' grace, and what release leaves.

kubesim's nodes advertise `nvidia.com/gpu`, the only stand-in (no GPU exists here). The ranks are
real PyTorch processes meeting at the first pod's DNS name (tests/pytorch/scripts/train_ddp.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import kubesim.fixture
from kubesim.indexes import finished_at
from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes import indexed
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.errors import NotFound
from trainguard.core.backends.kubernetes.manifests import JobSettings
from services.ports import rendezvous_port
from waiting import wait_for

DDP = str(Path(__file__).resolve().parents[2] / "pytorch" / "scripts" / "train_ddp.py")



def two_nodes(kube: KubeApi, ns: str, tmp_path: Path, **fields: Any) -> KubernetesBackend:
    job = JobSettings(image="python:3.11", namespace=ns, master_port=rendezvous_port(),
                      **{k: fields.pop(k) for k in ("hold_mode", "one_pod_per_node") if k in fields})
    return KubernetesBackend(lambda: kube, KubeSettings(job, local_root=str(tmp_path / "local"), **fields))


def ddp(run_id: str, tmp_path: Path, *args: str) -> Launch:
    command = (sys.executable, "-m", "torch.distributed.run", DDP, "--workdir", str(tmp_path), *args)
    return Launch(run_id=run_id, attempt=1, command=command, nodes=2, processes_per_node=2, gpus=1)


def test_two_pods_train_together_and_every_line_says_its_node(kube: KubeApi, sim: kubesim.fixture.Sim, ns: str,
                                                               tmp_path: Path) -> None:
    b = two_nodes(kube, ns, tmp_path)
    ref = b.provision("mn-ok", 1)
    lines: list[str] = []
    outcome = b.run(ref, ddp("mn-ok", tmp_path, "--steps", "3"), on_line=lines.append)
    assert outcome.succeeded, outcome
    job = kube.read_job(ns, ref.name)
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["backoffLimitPerIndex"]) == (
        "Indexed", 2, 0)
    assert job["status"]["completedIndexes"] == "0,1"
    service = kube.read_service(ns, ref.name)
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["ownerReferences"][0]["uid"] == \
        job["metadata"]["uid"]
    for node in (0, 1):  # torchrun prints each rank's lines as [defaultN]:..., under the node's prefix
        assert any(line.startswith(f"[node {node}] [default") and "step 2 loss" in line for line in lines), lines
    made = Counter((r["verb"], r["resource"]) for r in sim.requests(namespace=ns))
    assert made[("watch", "jobs")] == made[("watch", "pods")] == 1 and made[("create", "services")] == 1
    b.release(ref)
    wait_for(lambda: _gone(kube, ns, ref.name), timeout=30, what="the succeeded Job and its Service deleted")


def test_the_survivors_get_their_grace_and_the_first_failed_pod_is_the_outcomes(kube: KubeApi, ns: str,
                                                                                tmp_path: Path) -> None:
    """Rank 2 (node 1) raises; node 0's ranks lose their peer and fail on their own within the grace.

    Which pod ends first is a race: node 1's agent stops rank 3 before it exits, while node 0's ranks
    fail as soon as rank 2's sockets close. Naming the culprit is triage's (tests/flows/test_kube_multinode.py).
    """
    b = two_nodes(kube, ns, tmp_path, survivor_grace_seconds=60.0)
    ref = b.provision("mn-shape", 1)
    started = time.monotonic()
    outcome = b.run(ref, ddp("mn-shape", tmp_path, "--fault", "shape", "--fault-rank", "2", "--timeout-seconds", "30"))
    assert time.monotonic() - started < 60, "the attempt ended when both pods had, not after the grace"
    pods = {p["metadata"]["name"]: p for p in kube.list_pods(ns, f"job-name={ref.name}")["items"]}
    assert sorted(p["status"]["phase"] for p in pods.values()) == ["Failed", "Failed"]  # hold mode deleted neither
    assert outcome.exit_code == 1 and outcome.instance in pods
    assert finished_at(pods[outcome.instance]) == min(finished_at(p) for p in pods.values())


def test_a_survivor_still_running_after_the_grace_ends_the_attempt_and_release_deletes_it(
        kube: KubeApi, ns: str, tmp_path: Path) -> None:
    """Rank 3 sleeps in the training loop: the others wait in a collective for 600 s, far past the grace."""
    b = two_nodes(kube, ns, tmp_path, survivor_grace_seconds=2.0)
    ref = b.provision("mn-grace", 1)
    code = "import os, sys, time\nif os.environ['NODE_RANK'] == '1': sys.exit(3)\ntime.sleep(600)"
    launch = Launch(run_id="mn-grace", attempt=1, command=("python", "-c", code), nodes=2, gpus=1)
    lines: list[str] = []
    outcome = b.run(ref, launch, on_line=lines.append)
    assert outcome.exit_code == 3 and outcome.instance and outcome.instance.startswith(f"{ref.name}-1-")
    # the wait for the survivors is said once, with its bound
    assert [line for line in lines if "waiting up to" in line] == [
        f"trainguard: pod {outcome.instance} failed; waiting up to 2s for the other pods to end on their own "
        "(what they print meanwhile dates the failure)"]
    running = [p for p in kube.list_pods(ns, f"job-name={ref.name}")["items"] if p["status"]["phase"] == "Running"]
    assert [indexed.index_of(p) for p in running] == [0]  # still there for the evidence
    b.release(ref)
    wait_for(lambda: _gone(kube, ns, ref.name), timeout=30, what="the Job, its survivor and its Service deleted")


def test_release_returns_once_a_survivor_saving_on_notice_has_ended(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    """Node 0 answers the SIGTERM of the Job's deletion with a 2 s save: the next attempt's checkpoint
    choice must see it, and its pods must not meet this one on its port, so release waits for it."""
    b = two_nodes(kube, ns, tmp_path, survivor_grace_seconds=1.0)
    ref = b.provision("mn-drain", 1)
    saved = tmp_path / "saved-on-notice"
    code = ("import os, signal, sys, time\n"
            "def save(*_):\n    time.sleep(2); open(sys.argv[1], 'w').write('step 7'); sys.exit(143)\n"
            "signal.signal(signal.SIGTERM, save)\n"
            "print('node', os.environ['NODE_RANK'], 'up', flush=True)\n"
            "if os.environ['NODE_RANK'] == '1': sys.exit(3)\ntime.sleep(600)")
    # a 3600 s notice grace is 72 s under the shared kubesim's time scale: room for the entrypoint's stack sweep
    outcome = b.run(ref, Launch(run_id="mn-drain", attempt=1, command=("python", "-c", code, str(saved)), nodes=2,
                                gpus=1, notice_grace_seconds=3600))
    assert outcome.exit_code == 3
    assert [indexed.index_of(p) for p in kube.list_pods(ns, f"job-name={ref.name}")["items"]
            if p["status"]["phase"] == "Running"] == [0]  # the moment release would not wait: the survivor runs
    assert b.release(ref) is None
    assert saved.read_text() == "step 7"
    assert not [p for p in kube.list_pods(ns, f"job-name={ref.name}")["items"]
                if p["status"]["phase"] not in ("Succeeded", "Failed")]


def _gone(kube: KubeApi, ns: str, name: str) -> bool:
    for read in (kube.read_job, kube.read_service):
        try:
            read(ns, name)
            return False
        except NotFound:
            continue
    return True


def test_without_hold_mode_the_attempt_ends_at_the_first_failure_and_reads_the_survivor_while_it_terminates(
        kube: KubeApi, ns: str, tmp_path: Path) -> None:
    """A cluster before 1.29: backoffLimit 0, so the Job controller deletes the survivors when one pod fails."""
    from trainguard.core.stores.folder import LocalEvidenceStore

    b = two_nodes(kube, ns, tmp_path, hold_mode=False, survivor_grace_seconds=120.0)
    ref = b.provision("mn-old", 1)
    code = ("import os, sys, time\nprint('node', os.environ['NODE_RANK'], 'up', flush=True)\n"
            "if os.environ['NODE_RANK'] == '1': time.sleep(1); sys.exit(3)\ntime.sleep(600)")
    started = time.monotonic()
    outcome = b.run(ref, Launch(run_id="mn-old", attempt=1, command=("python", "-c", code), nodes=2, gpus=1))
    assert time.monotonic() - started < 60, "ended at the first failure, not after the survivors' grace"
    assert outcome.exit_code == 3 and outcome.instance and outcome.instance.startswith(f"{ref.name}-1-")
    job = kube.read_job(ns, ref.name)
    assert job["spec"]["backoffLimit"] == 0 and "backoffLimitPerIndex" not in job["spec"]
    b.collect_evidence(ref, LocalEvidenceStore(tmp_path / "evidence"), outcome)
    mapped = json.loads((tmp_path / "evidence" / "runs" / "mn-old" / "attempt-1" / "attempt.json").read_text())
    survivor = next(e for e in mapped["indexes"] if e["index"] == 0)
    # read while it terminated, or recorded as gone with why: never silently missing
    assert survivor.get("absent") or any(n.endswith("/logs/train.log") for n in survivor["evidence"])
