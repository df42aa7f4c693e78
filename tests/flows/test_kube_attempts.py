"""Attempts as Kubernetes Jobs end to end through the flows, against kubesim.

Each scenario asserts the category, the retry decision and what the evidence holds. The GPUs are
the only stand-in (kubesim's nodes advertise nvidia.com/gpu); the training processes, their logs,
exit codes, OOM kills and evictions are real.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import pytest

from simfixtures import sim_fixture
from flow_helpers import run
from kube_helpers import GPU_FAULT, evidence_names, inline, kept, kube_blocks, pod_of, run_logs, tiny
from trainguard.core.attempt import AttemptSummary
from trainguard.core.reports.attempt import render_attempt
from trainguard.core.spec import parse_spec
from waiting import wait_for


sim = sim_fixture()


@pytest.fixture
def kb(sim: Any, prefect_server: str, tmp_path: Any) -> dict[str, Any]:
    return kube_blocks(sim, tmp_path, start_error_seconds=1, unschedulable_seconds=2)


def one_attempt(spec: dict[str, Any], kb: dict[str, Any], run_id: str) -> tuple[Any, list[dict[str, Any]]]:
    """The attempt flow alone, without a run around it (~5 s less): its verdict says what would follow."""
    from flows.attempt import train_attempt

    state = train_attempt(parse_spec(spec), attempt=1, run_id=run_id, backend_block=kb["backend_block"],
                          evidence_block=kb["evidence_block"], return_state=True)
    return state, [kept(kb["evidence"], run_id, 1, "verdict.json")]


def in_background(spec: dict[str, Any], kb: dict[str, Any], run_id: str) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(run(spec, kb, run_id)), daemon=True)
    thread.start()
    return thread, box


def test_nccl_timeout_is_retried_and_the_next_job_resumes_from_the_checkpoint(kb: dict[str, Any]) -> None:
    spec = tiny("k-nccl", "--fail-at-step", "25", "--fail-on-attempt", "1", "--checkpoint-every", "10")
    state, history = run(spec, kb, "k-nccl-1")
    assert state.is_completed(), state.message
    assert [(h["category"], h["decision"]["retry"]) for h in history] == [("nccl_error", True), (None, False)]
    assert history[1]["resumed_from"] == "/trainguard/checkpoints/k-nccl-1/step-000020.json"
    log = kept(kb["evidence"], "k-nccl-1", 2, _pod_log_name(kb, "k-nccl-1", 2))
    assert "attempt 2: resumed from step 20" in log
    first_log = kept(kb["evidence"], "k-nccl-1", 1, _pod_log_name(kb, "k-nccl-1", 1))
    assert "Watchdog caught collective operation timeout" in first_log and "Watchdog" in history[0]["signature"]
    # the training output streamed live into the attempt's flow run logs, as the API returns them
    wait_for(lambda: any("Watchdog caught collective operation timeout" in m
                         for m in run_logs(history[0]["flow_run_id"])), timeout=20, what="the live log in Prefect")
    assert any(m.startswith("step 20/") for m in run_logs(history[0]["flow_run_id"]))


def test_oom_killed_is_host_oom_and_not_retried(prefect_server: str, sim: Any, tmp_path: Any) -> None:
    blocks = kube_blocks(sim, tmp_path / "oom", memory_limit="96Mi")
    code = "import time; print('allocating', flush=True); x = b'x' * (400 << 20); time.sleep(30)"
    state, history = one_attempt(inline("k-oom", code), blocks, "k-oom-1")
    assert state.is_failed()
    assert history[0]["category"] == "host_oom" and history[0]["decision"]["retry"] is False
    assert history[0]["termination_reason"] == "OOMKilled"
    pods = [n for n in evidence_names(blocks["evidence"], "k-oom-1", 1)
            if n.startswith("kubernetes/pods/") and n.endswith(".json") and n.count("/") == 2]
    pod = kept(blocks["evidence"], "k-oom-1", 1, pods[0])
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "OOMKilled"
    assert "allocating" in kept(blocks["evidence"], "k-oom-1", 1, _pod_log_name(blocks, "k-oom-1", 1))


def test_a_host_oom_made_retryable_runs_again_with_the_policys_larger_memory_limit(prefect_server: str, sim: Any,
                                                                                     tmp_path: Any) -> None:
    blocks = kube_blocks(sim, tmp_path / "oom-more", memory_limit="96Mi")
    retry = {"max_attempts": 2, "host_oom_memory_factor": 2, "overrides": {"host_oom": {"retryable": True}}}
    code = "x = b'x' * (120 << 20); print('fits', flush=True)"  # over 96Mi, under 192Mi
    state, history = run(inline("k-oom-more", code, retry=retry), blocks, "k-oom-more-1")
    assert state.is_completed(), state.message
    assert [(h["category"], h["memory_factor"]) for h in history] == [("host_oom", 1.0), (None, 2.0)]
    assert history[0]["decision"]["memory_factor"] == 2.0 and "raised to 2x" in history[0]["decision"]["reason"]
    limits = [kept(blocks["evidence"], "k-oom-more-1", n, "kubernetes/job.json")["spec"]["template"]["spec"][
        "containers"][0]["resources"]["limits"]["memory"] for n in (1, 2)]
    assert limits == ["96Mi", str(2 * 96 << 20)]
    assert "| memory | 2x the backend's memory" in render_attempt(AttemptSummary.from_dict(history[1]))


def test_eviction_is_preempted_retried_and_resumed_from_the_checkpoint(kb: dict[str, Any], sim: Any) -> None:
    spec = tiny("k-evict", "--fail-after-steps", "12", "--failure", "hang", "--fail-on-attempt", "1",
                "--checkpoint-every", "10")
    thread, box = in_background(spec, kb, "k-evict-1")
    pod = wait_for(lambda: pod_of(kb["api"], kb["namespace"], "k-evict-1", 1), timeout=60, what="attempt 1 running")
    checkpoint = sim.root / "pvc" / kb["namespace"] / "trainguard-checkpoints" / "k-evict-1" / "step-000010.json"
    wait_for(checkpoint.exists, timeout=30, what="attempt 1's checkpoint")
    sim.evict(kb["namespace"], pod)
    thread.join(120)
    state, history = box[0]
    assert state.is_completed(), state.message
    assert history[0]["category"] == "preempted" and history[0]["decision"]["retry"] is True
    assert history[1]["resumed_from"] == "/trainguard/checkpoints/k-evict-1/step-000010.json"
    first_pod = kept(kb["evidence"], "k-evict-1", 1, f"kubernetes/pods/{pod}.json")
    assert first_pod["status"]["reason"] == "Evicted"


def test_gpu_fault_keeps_the_next_attempt_off_the_failed_node(kb: dict[str, Any]) -> None:
    code = ("import os, sys\nif os.environ['TRAINGUARD_ATTEMPT'] == '1':\n"
            f"    print({GPU_FAULT!r}, flush=True); sys.exit(1)\nprint('ok on attempt 2')")
    state, history = run(inline("k-gpu", code), kb, "k-gpu-1")
    assert state.is_completed(), state.message
    assert history[0]["category"] == "gpu_fault" and history[0]["decision"]["retry"] is True
    bad = history[0]["node"]
    assert bad in ("gpu-node-1", "gpu-node-2") and history[0]["decision"]["avoid_nodes"] == [bad]
    job = kept(kb["evidence"], "k-gpu-1", 2, "kubernetes/job.json")
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [bad]}]}]
    assert history[1]["node"] != bad


def _pod_log_name(kb: dict[str, Any], run_id: str, attempt: int) -> str:
    names = evidence_names(kb["evidence"], run_id, attempt)
    return next(n for n in names if n.startswith("kubernetes/pods/") and n.endswith("/logs/train.log"))


def test_err_image_pull_is_config_error_not_retried_with_the_events_kept(sim: Any, tmp_path: Any,
                                                                          prefect_server: str) -> None:
    blocks = kube_blocks(sim, tmp_path, image="registry.example.com/missing/train:9", start_error_seconds=1)
    state, history = one_attempt(inline("k-pull", "print('never runs')"), blocks, "k-pull-1")
    assert state.is_failed()
    assert history[0]["category"] == "config_error" and history[0]["decision"]["retry"] is False
    events = kept(blocks["evidence"], "k-pull-1", 1, "kubernetes/events.json")
    assert any(e["reason"] == "Failed" and "registry.example.com/missing/train:9" in e["message"] for e in events)


def test_insufficient_gpus_is_unschedulable_after_the_schedulers_event_with_a_longer_wait(kb: dict[str, Any]) -> None:
    # the attempt flow alone: its decision says when the next attempt would start, none is run here
    state, (verdict,) = one_attempt(inline("k-gpus", "print('never runs')", gpus=8), kb, "k-gpus-1")
    assert state.is_failed() and verdict["category"] == "unschedulable"
    assert verdict["termination_reason"] == "Unschedulable"
    # the spec asks for no delay; waiting for capacity takes the taxonomy's longer one
    assert verdict["decision"]["retry"] is True and verdict["decision"]["delay_seconds"] == 60.0
    events = kept(kb["evidence"], "k-gpus-1", 1, "kubernetes/events.json")
    assert any(e["reason"] == "FailedScheduling" and "Insufficient nvidia.com/gpu" in e["message"] for e in events)


def test_active_deadline_exceeded_is_timeout(kb: dict[str, Any]) -> None:
    spec = tiny("k-deadline", "--steps", "1000", "--step-seconds", "0.05", deadline_seconds=2,
                retry={"max_total_attempts": 1})
    state, history = one_attempt(spec, kb, "k-deadline-1")
    assert state.is_failed() and history[0]["category"] == "timeout" and history[0]["retryable"] is True
    assert history[0]["decision"]["retry"] is False and "budget spent: 1 of 1" in history[0]["decision"]["reason"]
    job = kept(kb["evidence"], "k-deadline-1", 1, "kubernetes/job.json")
    assert job["spec"]["activeDeadlineSeconds"] == 2
    assert any(c["reason"] == "DeadlineExceeded" for c in job["status"]["conditions"])


# A log shipper run as a native sidecar: its first instance crashes, the kubelet restarts it.
SHIPPER = """
import pathlib, sys, time
folder = pathlib.Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
if not (folder / 'shipper-crashed').exists():
    (folder / 'shipper-crashed').touch()
    print('shipper: collector refused the connection', flush=True)
    sys.exit(1)
print('shipper: shipping', flush=True)
(folder / 'shipper-up').touch()
while True:
    time.sleep(0.1)
"""


def test_a_fail_job_exit_code_fails_the_job_at_once_and_a_crashed_sidecar_keeps_its_previous_log(
        sim: Any, tmp_path: Any, prefect_server: str) -> None:
    folder = "/trainguard/attempts/runs/k-failjob-1"  # the run's folder on the attempt volume
    shipper = {"name": "shipper", "image": "python:3.11", "restartPolicy": "Always",
               "command": ["python", "-c", SHIPPER, folder],
               "volumeMounts": [{"name": "trainguard-attempts", "mountPath": "/trainguard/attempts"}]}
    blocks = kube_blocks(sim, tmp_path, job_template={"spec": {"template": {"spec": {"initContainers": [shipper]}}}})
    # the command ends once the restarted shipper is up, so the sidecar's crash precedes it
    code = (f"import pathlib, time\nup = pathlib.Path({folder!r}) / 'shipper-up'\nend = time.monotonic() + 60\n"
            "while not up.exists() and time.monotonic() < end:\n    time.sleep(0.05)\nraise SystemExit(127)")
    state, history = one_attempt(inline("k-failjob", code), blocks, "k-failjob-1")
    assert state.is_failed() and history[0]["exit_code"] == 127
    assert (history[0]["category"], history[0]["rule_id"]) == ("config_error", "exit.command_not_found")
    assert history[0]["decision"]["retry"] is False and "not retryable" in history[0]["decision"]["reason"]
    job = kept(blocks["evidence"], "k-failjob-1", 1, "kubernetes/job.json")
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy" and "Container train for pod" in failed["message"]
    # the sidecar's crashed instance and its current one are both in the evidence, as logged
    logs = _pod_log_name(blocks, "k-failjob-1", 1).rsplit("/", 1)[0]
    assert kept(blocks["evidence"], "k-failjob-1", 1, f"{logs}/shipper.previous.log") == (
        "shipper: collector refused the connection\n")
    assert kept(blocks["evidence"], "k-failjob-1", 1, f"{logs}/shipper.log") == "shipper: shipping\n"
    items = {i["name"] for i in kept(blocks["evidence"], "k-failjob-1", 1, "manifest.json")["items"]}
    assert {f"{logs}/shipper.previous.log", f"{logs}/shipper.log", f"{logs}/train.log"} <= items
    # triage read the training container, not the sidecar (SIGTERMed at the end: 143)
    triage = kept(blocks["evidence"], "k-failjob-1", 1, "kubernetes/triage.json")
    assert (triage["container"], triage["exit_code"]) == ("train", 127) and "shipper" not in triage["log_item"]


def test_sigsegv_keeps_its_core_file_in_the_evidence_through_the_collector(kb: dict[str, Any], sim: Any) -> None:
    state, history = one_attempt(tiny("k-segv", "--fail-at-step", "5", "--failure", "segfault", retry={"max_total_attempts": 1}),
                         kb, "k-segv-1")
    assert state.is_failed() and history[0]["exit_code"] == 139 and history[0]["category"] == "native_crash"
    # the crash report and the core file came back into the evidence through the collector pod
    report = kept(kb["evidence"], "k-segv-1", 1, "crash-report.json")
    assert report["signal_name"] == "SIGSEGV" and report["core_files"]
    items = {i["name"]: i for i in kept(kb["evidence"], "k-segv-1", 1, "manifest.json")["items"]}
    core = items[f"coredumps/{report['core_files'][0]}"]
    stored = (kb["evidence"] / "runs" / "k-segv-1" / "attempt-1" / core["name"]).read_bytes()
    assert core["size_bytes"] > 0 and hashlib.sha256(stored).hexdigest() == core["sha256"]
    # the one way the volume's files reach the flow: the collector pod's log, read through the API
    assert any("-evidence-" in str(r.get("name")) for r in sim.requests(
        resource="pods", subresource="log", namespace=kb["namespace"]))
