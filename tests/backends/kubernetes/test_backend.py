"""KubernetesBackend against kubesim without Prefect: adoption, release, checkpoints, the
supervisor's bounded waits and the outcome it reports. nvidia.com/gpu on kubesim's nodes is the
only stand-in (no GPU exists here)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import kubesim.fixture
from trainguard.core.backends.base import Launch
from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings
from trainguard.core.backends.kubernetes.manifests import JobSettings
from trainguard.core import triage
from trainguard.core.backends.kubernetes.podstate import printable
from trainguard.demo import SCRIPT
from waiting import wait_for


def backend(kube: KubeApi, ns: str, tmp_path: Path, **fields: Any) -> KubernetesBackend:
    return KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns),
                                                        local_root=str(tmp_path), **fields))


def launch(run_id: str, code: str, **fields: Any) -> Launch:
    return Launch(run_id=run_id, attempt=1, command=("python", "-c", code), **fields)


def test_a_second_run_of_the_same_attempt_adopts_the_job(kube: KubeApi, sim: kubesim.fixture.Sim, ns: str,
                                                          tmp_path: Path) -> None:
    b = backend(kube, ns, tmp_path)
    ref = b.provision("r-adopt", 1)
    code = "import time\nfor i in range(20):\n  print('tick', i, flush=True); time.sleep(0.05)"
    first = b.run(ref, launch("r-adopt", code))
    # Supervising the Job it created costs two watches from the Job's resourceVersion and one log stream.
    made = Counter((r["verb"], r["resource"], r.get("subresource")) for r in sim.requests(namespace=ns))
    assert made[("watch", "jobs", None)] == made[("watch", "pods", None)] == 1 and made[("get", "pods", "log")] == 1
    assert made[("list", "jobs", None)] == 0 and made[("list", "pods", None)] <= 1  # a lagging pod watch: one read
    lines: list[str] = []
    second = b.run(b.provision("r-adopt", 1), launch("r-adopt", code), on_line=lines.append)
    assert first.succeeded and second.succeeded and second.node == first.node
    assert [r["code"] for r in sim.requests(verb="create", resource="jobs", namespace=ns)] == [201, 409]
    assert lines[0].startswith("trainguard: adopting the running Job") and "tick 19" in lines


def test_release_deletes_finished_successes_and_gives_failures_their_ttl(kube: KubeApi, ns: str,
                                                                         tmp_path: Path) -> None:
    b = backend(kube, ns, tmp_path, failed_job_ttl_seconds=3600)
    ok, bad = b.provision("r-ok", 1), b.provision("r-bad", 1)
    assert b.run(ok, launch("r-ok", "pass")).succeeded
    assert b.run(bad, launch("r-bad", "raise SystemExit(1)")).exit_code == 1
    b.release(ok)
    b.release(bad)
    assert kube.read_job(ns, bad.name)["spec"]["ttlSecondsAfterFinished"] == 3600
    wait_for(lambda: ok.name not in {j["metadata"]["name"] for j in kube.list_jobs(ns)["items"]}, what="deleted")
    b.release(ok)  # already gone: nothing to do, nothing raised


def test_a_fail_job_exit_code_fails_the_job_at_once(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    b = backend(kube, ns, tmp_path)
    ref = b.provision("r-failjob", 1)
    outcome = b.run(ref, launch("r-failjob", "raise SystemExit(127)"))
    failed = next(c for c in kube.read_job(ns, ref.name)["status"]["conditions"] if c["type"] == "Failed")
    assert outcome.exit_code == 127 and not outcome.succeeded
    assert failed["reason"] == "PodFailurePolicy" and "matching FailJob rule" in failed["message"]


def test_sigsegv_is_a_native_crash_with_its_core_file_on_the_attempt_volume(
    kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path,
) -> None:
    b = backend(kube, ns, tmp_path)
    ref = b.provision("r-segv", 1)
    command = ("python", str(SCRIPT), "--steps", "30", "--step-seconds", "0", "--fail-at-step", "5", "--failure", "segfault")
    outcome = b.run(ref, Launch(run_id="r-segv", attempt=1, command=command))
    assert outcome.exit_code == 139 and triage.classify(b.signals(ref, outcome)).category.value == "native_crash"
    volume = sim.root / "pvc" / ns / "trainguard-attempts" / "runs" / "r-segv" / "attempt-1"
    report = json.loads((volume / "crash-report.json").read_text())
    assert report["signal_name"] == "SIGSEGV" and report["core_files"]
    assert (volume / "coredumps" / report["core_files"][0]).stat().st_size > 0


def test_an_unschedulable_attempt_waits_its_bound_then_reports_and_is_deleted_on_release(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    b = backend(kube, ns, tmp_path, unschedulable_seconds=1)
    ref = b.provision("r-sched", 1)
    outcome = b.run(ref, launch("r-sched", "pass", gpus=16))
    assert outcome.reason == "Unschedulable" and "Insufficient nvidia.com/gpu" in outcome.message
    b.release(ref)
    wait_for(lambda: not kube.list_jobs(ns)["items"], what="the pending Job deleted")


def test_a_sidecar_that_cannot_pull_its_image_ends_the_attempt_as_a_start_error(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    sidecar = {"name": "shipper", "image": "registry.example.com/missing/shipper:1", "restartPolicy": "Always"}
    settings = JobSettings(image="python:3.11", namespace=ns,
                           job_template={"spec": {"template": {"spec": {"initContainers": [sidecar]}}}})
    b = KubernetesBackend(lambda: kube, KubeSettings(settings, local_root=str(tmp_path), start_error_seconds=1))
    ref = b.provision("r-sidecar-pull", 1)
    # the training container waits (PodInitializing) behind the sidecar that cannot start
    outcome = b.run(ref, launch("r-sidecar-pull", "print('never runs')"))
    assert outcome.reason in ("ErrImagePull", "ImagePullBackOff") and "missing/shipper:1" in outcome.message
    assert triage.classify(b.signals(ref, outcome)).category.value == "config_error"
    b.release(ref)


def test_a_silent_attempt_is_stopped_as_stalled(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    b = backend(kube, ns, tmp_path)
    ref = b.provision("r-stall", 1)
    outcome = b.run(ref, launch("r-stall", "import time; print('start', flush=True); time.sleep(60)",
                                stall_seconds=1.5))
    assert outcome.reason == "Stalled" and outcome.log_tail.startswith("start")
    b.release(ref)


def test_checkpoints_are_listed_newest_first_as_container_paths(kube: KubeApi, sim: kubesim.fixture.Sim, ns: str,
                                                                tmp_path: Path) -> None:
    b = backend(kube, ns, tmp_path)
    code = ("import os\nd = os.environ['TRAINGUARD_CHECKPOINT_DIR']\n"
            "for n in ('step-000010.pt', 'step-000020.pt', '.step-000030.pt.tmp'):\n  open(os.path.join(d, n), 'w').write('x')\n"
            "open(os.path.join(d, 'step-000040.pt'), 'w').close()")  # empty: what a full disk leaves
    assert b.run(b.provision("r-ckpt", 1), launch("r-ckpt", code)).succeeded
    expected = ["/trainguard/checkpoints/r-ckpt/step-000020.pt", "/trainguard/checkpoints/r-ckpt/step-000010.pt"]
    assert b.checkpoints("r-ckpt") == expected
    assert b.checkpoints("r-none") == []
    # the attempt's provisioning made the entrypoint ConfigMap the listings run from: not asked for again
    assert [r["code"] for r in sim.requests(verb="create", resource="configmaps", namespace=ns)] == [201]


@pytest.mark.parametrize(("raw", "shown"), [
    (b"\x1b[31mred\x1b[0m text\r", "red text"), (b"\xff\xfebad", "\ufffd\ufffdbad"),
    (b"\x1b]0;title\x07ok", "ok"), (b"a\x00b\tc", "ab\tc"), (b"x" * 20000, "x" * 8192),
])
def test_log_lines_are_made_safe_to_show(raw: bytes, shown: str) -> None:
    assert printable(raw) == shown


def test_the_pods_oom_kill_wins_over_the_jobs_verdict_when_the_job_is_seen_failing_first(
    kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path,
) -> None:
    # The pod watch answers late, so the Job's Failed condition arrives before any pod status.
    sim.faults.add(verb="watch", resource="pods", namespace=ns, delay=30, times=1)
    b = KubernetesBackend(lambda: kube, KubeSettings(JobSettings(image="python:3.11", namespace=ns, memory_limit="96Mi"),
                                                     local_root=str(tmp_path)))
    outcome = b.run(b.provision("r-oom", 1), launch("r-oom", "x = b'x' * (400 << 20)"))
    assert [r["code"] for r in sim.requests(verb="watch", resource="pods", namespace=ns)] == [None]  # still held
    assert outcome.reason == "OOMKilled" and outcome.exit_code == 137


def _pod(name: str, node: str, state: dict[str, Any], conditions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "train"}]},
            "status": {"conditions": conditions, "containerStatuses": [{"name": "train", "state": state}]}}


def test_evidence_is_read_from_the_pod_the_attempt_ended_on_not_from_its_replacement(tmp_path: Path) -> None:
    from dataclasses import replace

    from trainguard.core.backends.kubernetes.backend import outcome_of_ending
    from trainguard.core.backends.kubernetes.scene import Scene, facts_of
    from trainguard.core.backends.kubernetes.supervise import Ending

    # A disruption the Job ignored: the supervisor ended on the disrupted pod, the Job made another.
    ended = _pod("tg-r-a1-aaaaa", "gpu-node-1", {"terminated": {"exitCode": 143, "message": "disrupted"}},
                 [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}])
    newer = _pod("tg-r-a1-bbbbb", "gpu-node-2", {"running": {}}, [])
    outcome = outcome_of_ending(Ending(job=None, pod=ended, why="disrupted"))
    assert outcome.instance == "tg-r-a1-aaaaa"
    scene = Scene(namespace="ns", job_name="tg-r-a1", run_id="r", attempt=1, spool=tmp_path, pods=[ended, newer],
                  supervised_pod=outcome.instance)
    facts = facts_of(scene)
    assert (facts.pod_name, facts.node, facts.exit_code, facts.termination_message) == (
        "tg-r-a1-aaaaa", "gpu-node-1", 143, "disrupted")
    assert any(c.get("type") == "DisruptionTarget" for c in facts.conditions)
    assert facts_of(replace(scene, supervised_pod=None)).pod_name == "tg-r-a1-bbbbb"  # the newest, unpinned
    assert facts_of(replace(scene, supervised_pod="tg-r-a1-gone")).pod_name == "tg-r-a1-bbbbb"
