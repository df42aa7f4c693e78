"""Cluster evidence against kubesim: real Jobs, the real client over HTTP, the real entrypoint.

Each scenario makes a Job fail the way clusters make them fail, then freezes the evidence and
checks what was kept and what was recorded missing, with why. Nothing is patched.
"""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path

import pytest
from evidence_helpers import (
    Kept, collectors, job_failed, kept_facts, kept_signals, pods_of, trainguard_job, training_job,
)

import kubesim.fixture
from trainguard.core.backends.kubernetes import errors
from trainguard.core.backends.kubernetes.api import KubeApi, RetrySettings
from trainguard.core.backends.kubernetes.evidence import collect_kubernetes_evidence
from trainguard.core.backends.kubernetes.scene import BreakerApi
from trainguard.core.stores.folder import LocalEvidenceStore
from trainguard.core.taxonomy import Category
from trainguard.core.triage import classify
from waiting import wait_for

_SEGV = ("import os, pathlib, signal\n"
         "print('step 1 loss 2.0')\n"
         "ckpt = pathlib.Path(os.environ['TRAINGUARD_CHECKPOINT_DIR'])\n"
         "ckpt.mkdir(parents=True, exist_ok=True)\n"
         "(ckpt / 'step-000001.pt').write_bytes(b'w' * 64)\n"
         "os.kill(os.getpid(), signal.SIGSEGV)\n")
_STEADY = ("import time\n"
           "print('step 1 loss 2.0', flush=True)\n"
           "time.sleep(60)\n")


def _collect(kube: KubeApi, ns: str, job: str, tmp_path: Path, run_id: str = "run-1") -> Kept:
    store = LocalEvidenceStore(tmp_path / "evidence")
    manifest = collect_kubernetes_evidence(kube, ns, job, run_id, 1, store, kept_dir=tmp_path / "triage",
                                           collector_timeout_seconds=30)
    return Kept(store, manifest)


def _failed(kube: KubeApi, ns: str, name: str) -> None:
    wait_for(lambda: job_failed(kube, ns, name), timeout=30, what=f"Job {name} Failed")


def test_sigsegv_core_file_is_reached_through_the_volume_and_the_collector_pod_is_deleted(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    job = trainguard_job(kube, ns, _SEGV)
    _failed(kube, ns, job)
    pod = pods_of(kube, ns, job)[0]["metadata"]["name"]

    kept = _collect(kube, ns, job, tmp_path)

    cores = kept.names("coredumps/")
    assert cores, kept.why("coredumps")
    assert kept.json("crash-report.json")["signal"] == signal.SIGSEGV
    assert b"step 1 loss 2.0" in kept.read("logs/train-run-1-attempt-1.log")
    assert "snapshot/env.json" in kept.items and b"hf_secret_value" not in kept.read("snapshot/env.json")
    assert [f["name"] for f in kept.json("checkpoints.json")["files"]] == ["step-000001.pt"]
    assert "stays on the checkpoint volume" in kept.why("checkpoint/step-000001.pt")
    pod_json = kept.json(f"kubernetes/pods/{pod}.json")
    terminated = pod_json["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 139
    assert b"hf_secret_value" not in kept.read(f"kubernetes/pods/{pod}.json")
    assert b"hf_secret_value" not in kept.read("kubernetes/job.json")
    assert json.loads(kept.read("termination-message.txt"))["exit_code"] == 139  # the entrypoint's summary
    facts = kept_facts(tmp_path / "triage")
    assert (facts.exit_code, facts.signal, facts.node) == (139, 11, pod_json["spec"]["nodeName"])
    assert facts.log_path and b"step 1 loss" in Path(facts.log_path).read_bytes()
    wait_for(lambda: not collectors(kube, ns), what="the collector pod deleted")


def test_oom_killed_pod_keeps_its_termination_state_log_and_volume_files(
    kube: KubeApi, sim: kubesim.fixture.Sim, ns: str, tmp_path: Path,
) -> None:
    job = trainguard_job(kube, ns, _STEADY)

    def printing() -> str | None:
        for p in pods_of(kube, ns, job):
            with contextlib.suppress(errors.Invalid):  # not started yet
                if b"step 1" in kube.read_pod_log(ns, p["metadata"]["name"], "train"):
                    return str(p["metadata"]["name"])
        return None

    pod = wait_for(printing, timeout=30, what="the training pod printing")
    sim.oom_kill(ns, pod, "train")
    _failed(kube, ns, job)

    kept = _collect(kube, ns, job, tmp_path)

    state = kept.json(f"kubernetes/pods/{pod}.json")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["reason"], state["exitCode"]) == ("OOMKilled", 137)
    assert b"step 1 loss 2.0" in kept.read(f"kubernetes/pods/{pod}/logs/train.log")
    assert b"step 1 loss 2.0" in kept.read("logs/train-run-1-attempt-1.log")  # from the volume
    assert "Reason:       OOMKilled" in kept.read(f"kubernetes/pods/{pod}/describe.txt").decode()
    assert "killed (SIGKILL)" in kept.why("crash-report.json")
    facts = kept_facts(tmp_path / "triage")
    assert (facts.reason, facts.exit_code) == ("OOMKilled", 137)
    stored = kept.json("kubernetes/triage.json")  # the store's copy says the same, with no path of this machine
    assert (stored["reason"], stored["exit_code"], stored["log_path"]) == ("OOMKilled", 137, None)
    assert classify(kept_signals(tmp_path / "triage")).category is Category.HOST_OOM
    node = facts.node
    assert kept.json(f"kubernetes/nodes/{node}.json")["allocatable"]["nvidia.com/gpu"] == "2"
    assert any(c["type"] == "Ready" for c in kept.json(f"kubernetes/nodes/{node}.json")["conditions"])
    wait_for(lambda: not collectors(kube, ns), what="the collector pod deleted")


def test_previous_log_of_a_crashed_init_container_is_kept(kube: KubeApi, ns: str, tmp_path: Path) -> None:
    marker = tmp_path / "init-ran-once"
    init = {"name": "fetch-data", "image": "python:3.11", "command": [
        "python", "-c", "import os, sys\n"
        f"first = not os.path.exists({str(marker)!r})\n"
        f"open({str(marker)!r}, 'a').close()\n"
        "print('fetch attempt', 'one: checksum mismatch' if first else 'two: ok', flush=True)\n"
        "sys.exit(1 if first else 0)\n"]}
    kube.create_job(ns, training_job("init", _STEADY, run_id="run-1", volumes=False, restart="OnFailure",
                                     backoff=3, init=init))

    def restarted_and_running() -> str | None:
        for p in pods_of(kube, ns, "init"):
            inits = (p.get("status") or {}).get("initContainerStatuses") or []
            mains = (p.get("status") or {}).get("containerStatuses") or []
            if inits and inits[0].get("restartCount") and mains and "running" in mains[0].get("state", {}):
                return str(p["metadata"]["name"])
        return None

    pod = wait_for(restarted_and_running, timeout=30, what="the init container restarted once")
    kept = _collect(kube, ns, "init", tmp_path)

    base = f"kubernetes/pods/{pod}/logs"
    assert kept.read(f"{base}/fetch-data.previous.log") == b"fetch attempt one: checksum mismatch\n"
    assert kept.read(f"{base}/fetch-data.log") == b"fetch attempt two: ok\n"
    assert "never restarted" in kept.why(f"{base}/train.previous.log")
    assert "TRAINGUARD_WORKSPACE" in kept.why("volume")
    kube.delete_job(ns, "init")


def test_err_image_pull_keeps_the_events_and_says_why_logs_are_missing(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    job = trainguard_job(kube, ns, _STEADY, image="registry.invalid/acme/train:9")

    def pull_failed() -> bool:
        events = kube.list_events(ns, field_selector="reason=Failed").get("items") or []
        return any("registry.invalid" in str(e.get("message")) for e in events)

    wait_for(pull_failed, timeout=30, what="the image pull to fail")
    pod = pods_of(kube, ns, job)[0]["metadata"]["name"]

    kept = _collect(kube, ns, job, tmp_path)

    reasons = {e["reason"] for e in kept.json("kubernetes/events.json")}
    assert {"Scheduled", "Failed", "SuccessfulCreate"} <= reasons
    times = [e["lastTimestamp"] for e in kept.json("kubernetes/events.json")]
    assert times == sorted(times)
    assert "waiting to start" in kept.why(f"kubernetes/pods/{pod}/logs/train.log")
    assert "ErrImagePull" in kept.why("volume")  # the collector uses the same image, and says so
    facts = kept_facts(tmp_path / "triage")
    assert facts.reason in ("ErrImagePull", "ImagePullBackOff")
    assert any(e.get("reason") == "Failed" for e in facts.events)
    assert classify(kept_signals(tmp_path / "triage")).category is Category.CONFIG_ERROR
    kube.delete_job(ns, job)
    wait_for(lambda: not collectors(kube, ns), what="the collector pod deleted")


def test_a_pod_already_deleted_is_recorded_absent_and_the_rest_is_still_collected(
    kube: KubeApi, ns: str, tmp_path: Path,
) -> None:
    job = trainguard_job(kube, ns, "import sys; print('bad config'); sys.exit(2)", attempt_volume="hostPath")
    _failed(kube, ns, job)
    pod = pods_of(kube, ns, job)[0]["metadata"]["name"]
    kube.delete_pod(ns, pod, grace_seconds=0)
    wait_for(lambda: not pods_of(kube, ns, job), what="the pod deleted")

    kept = _collect(kube, ns, job, tmp_path)

    assert "is gone" in kept.why(f"kubernetes/pods/{pod}.json")
    assert "kubernetes/job.json" in kept.items
    assert any(e["involvedObject"]["name"] == pod for e in kept.json("kubernetes/events.json"))
    assert b"bad config" in kept.read("logs/train-run-1-attempt-1.log")  # the volume outlived the pod
    assert kept.json("crash-report.json")["exit_code"] == 2
    assert "no pod of the Job" in kept.why("termination-message.txt")
    assert kept_facts(tmp_path / "triage").node in ("gpu-node-1", "gpu-node-2")  # from its events


@pytest.mark.parametrize("resource", ["pods", "events", "everything", "node events forbidden"])
def test_api_errors_during_collection_become_absent_items_never_an_exception(
    sim: kubesim.fixture.Sim, kube: KubeApi, ns: str, tmp_path: Path, resource: str,
) -> None:
    job = trainguard_job(kube, ns, "import sys; sys.exit(1)")
    _failed(kube, ns, job)
    impatient = KubeApi.from_kubeconfig(str(sim.kubeconfig),
                                        retry=RetrySettings(attempts=2, first_delay_seconds=0.01))
    if resource == "everything":
        sim.faults.add(namespace=ns, status=503)
    elif resource == "node events forbidden":
        sim.faults.add(verb="list", resource="events", namespace="default", status=403)
    else:
        sim.faults.add(verb="list", resource=resource, namespace=ns, status=503)
    try:
        kept = _collect(impatient, ns, job, tmp_path)
    finally:
        sim.faults.clear()
        impatient.close()

    assert "manifest.json" not in kept.missing and "kubernetes/triage.json" in kept.items
    if resource == "pods":
        assert "503" in kept.why("kubernetes/pods") and "API error" in kept.why("kubernetes/pods")
        assert "crash-report.json" in kept.items  # the volume was still read, through the Job's template
    elif resource == "events":
        assert "503" in kept.why(f"kubernetes/events.json (Job {job})")
        assert "kubernetes/job.json" in kept.items and len(kept.names("kubernetes/pods/")) >= 2
    elif resource == "node events forbidden":
        node = kept_facts(tmp_path / "triage").node
        assert "grant `events: list` in namespace default" in kept.why(f"kubernetes/events.json (Node {node})")
        assert f"kubernetes/nodes/{node}.json" in kept.items and "kubernetes/events.json" in kept.items
    else:
        assert "503" in kept.why("kubernetes/job.json") and "503" in kept.why("kubernetes/pods")
        assert "neither the Job nor any pod" in kept.why("volume")


def test_after_three_transient_failures_in_a_row_collection_stops_calling_the_api(
    sim: kubesim.fixture.Sim, ns: str,
) -> None:
    impatient = KubeApi.from_kubeconfig(str(sim.kubeconfig), retry=RetrySettings(attempts=2, first_delay_seconds=0))
    breaker = BreakerApi(impatient)
    sim.faults.add(namespace=ns, status=503)
    try:
        messages = []
        for _ in range(4):
            with pytest.raises(errors.Transient) as caught:
                breaker.read_job(ns, "any")
            messages.append(str(caught.value))
    finally:
        sim.faults.clear()
    assert len(sim.requests(verb="get", namespace=ns, name="any")) == 6  # 3 calls x 2 attempts, then none
    assert "not tried: the API failed 3 times in a row" in messages[3] and "503" in messages[3]
    with pytest.raises(errors.Transient, match="not tried"):
        breaker.list_pods(ns)  # the API answers again, but this collection has given up on it
    impatient.close()
