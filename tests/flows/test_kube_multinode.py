"""Attempts of two nodes on Kubernetes through the flows, against a 2-node kubesim: an Indexed Job of
two pods behind a headless Service, each pod a torchrun agent of two ranks.

The ranks are real PyTorch (torch.distributed over gloo, tests/pytorch/scripts/train_ddp.py) meeting
at the first pod's DNS name; the evictions, exit codes and logs are real. The GPUs are the one
stand-in: kubesim's nodes advertise nvidia.com/gpu, and the GPU fault is the driver's Xid line the
script prints before its rank dies (no GPU exists here). Each scenario checks the category, the
retry decision, the root cause across the pods, its victims, and the evidence of both pods.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from simfixtures import sim_fixture
from flow_helpers import run
from kube_helpers import kept, kube_blocks
from rbac_check import allowed_by_rbac, calls
from trainguard.core.attempt import AttemptSummary
from trainguard.core.backends.kubernetes import indexed, manifests
from trainguard.core.reports.attempt import render_attempt
from trainguard.core.spec import parse_spec
from services.ports import rendezvous_port
from waiting import wait_for

sim = sim_fixture()
DDP = str(Path(__file__).resolve().parents[1] / "pytorch" / "scripts" / "train_ddp.py")
EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "ddp" / "train.py")  # checkpoints and resumes



@pytest.fixture
def kb(sim: Any, prefect_server: str, tmp_path: Path) -> dict[str, Any]:
    return kube_blocks(sim, tmp_path, master_port=rendezvous_port(), survivor_grace_seconds=30)


def ddp(name: str, *args: str, script: str = DDP, **fields: Any) -> dict[str, Any]:
    retry = {"delay_seconds": 0, **fields.pop("retry", {})}
    return {"name": name, "nodes": 2, "processes_per_node": 2, "gpus": 1, "retry": retry,
            "command": ["python", "-m", "torch.distributed.run", script, *args], **fields}


def in_background(spec: dict[str, Any], kb: dict[str, Any], run_id: str) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(run(spec, kb, run_id)), daemon=True)
    thread.start()
    return thread, box


def pod_at(kb: dict[str, Any], run_id: str, attempt: int, index: int) -> dict[str, Any] | None:
    """The attempt's running pod of one node rank."""
    for pod in kb["api"].list_pods(kb["namespace"], manifests.selector(run_id, attempt))["items"]:
        if indexed.index_of(pod) == index and pod["status"].get("phase") == "Running":
            return dict(pod)
    return None


def both_pods(kb: dict[str, Any], run_id: str, attempt: int, service: str = "",
              container: str = "train") -> dict[int, dict[str, Any]]:
    """attempt.json's entries by node rank, each with its pod's own items in the evidence."""
    mapped = kept(kb["evidence"], run_id, attempt, "attempt.json")
    entries = {e["index"]: e for e in mapped["indexes"]}
    assert sorted(entries) == [0, 1] and mapped["service"] == (service or manifests.job_name(run_id, attempt))
    for index, entry in entries.items():
        assert entry["ranks"] == [2 * index, 2 * index + 1]
        assert f"kubernetes/pods/{entry['pod']}/logs/{container}.log" in entry["evidence"]
        assert f"kubernetes/pods/{entry['pod']}/describe.txt" in entry["evidence"]
        kept(kb["evidence"], run_id, attempt, f"kubernetes/pods/{entry['pod']}/logs/{container}.log")  # it is there
    return entries


def test_all_ranks_succeed_and_both_pods_logs_are_in_the_evidence(kb: dict[str, Any]) -> None:
    state, history = run(ddp("mn-ok", "--steps", "3"), kb, "mn-ok-1")
    assert state.is_completed(), state.message
    assert [h["state"] for h in history] == ["Completed"]
    entries = both_pods(kb, "mn-ok-1", 1)
    assert [entries[i]["exit_code"] for i in (0, 1)] == [0, 0]
    log_name = "train-mn-ok-1-attempt-1.log"
    for folder in ("logs", "tasks/1/logs"):  # each node's entrypoint log, from the attempt volume
        assert "step 2 loss" in kept(kb["evidence"], "mn-ok-1", 1, f"{folder}/{log_name}")
    assert kept(kb["evidence"], "mn-ok-1", 1, "kubernetes/service.json")["spec"]["clusterIP"] == "None"


def test_rank_2_s_shape_mismatch_is_its_code_error_though_node_0_names_a_victim(kb: dict[str, Any]) -> None:
    spec = ddp("mn-shape", "--fault", "shape", "--fault-rank", "2", "--timeout-seconds", "30")
    state, history = run(spec, kb, "mn-shape-1")
    assert state.is_failed() and len(history) == 1
    only = history[0]
    assert (only["category"], only["decision"]["retry"]) == ("code_error", False)
    root = only["root_cause"]
    entries = both_pods(kb, "mn-shape-1", 1)
    assert (root["index"], root["rank"], root["pod"]) == (1, 2, entries[1]["pod"])
    assert root["node"] == entries[1]["node"] and root["first_error_at"]
    assert {v["index"] for v in only["victims"]} >= {0} and entries[1]["pod"] != entries[0]["pod"]
    node_0 = kept(kb["evidence"], "mn-shape-1", 1, f"kubernetes/pods/{entries[0]['pod']}/logs/train.log")
    assert "Root Cause" in node_0 and "mat1 and mat2 shapes cannot be multiplied" not in node_0
    error = kept(kb["evidence"], "mn-shape-1", 1, "tasks/1/torchelastic/error.json")
    assert "mat1 and mat2 shapes cannot be multiplied" in str(error)


def test_an_evicted_pod_is_preempted_on_index_1_retried_and_resumed(kb: dict[str, Any], sim: Any) -> None:
    spec = ddp("mn-evict", "--steps", "60", "--checkpoint-every", "5", "--step-seconds", "0.1", script=EXAMPLE)
    thread, box = in_background(spec, kb, "mn-evict-1")
    folder = sim.root / "pvc" / kb["namespace"] / "trainguard-checkpoints" / "mn-evict-1"
    wait_for(lambda: (folder / "step-000005.pt").exists(), timeout=240, what="attempt 1's first checkpoint")
    victim = wait_for(lambda: pod_at(kb, "mn-evict-1", 1, 1), timeout=30, what="index 1's pod running")
    sim.evict(kb["namespace"], victim["metadata"]["name"])
    thread.join(600)
    state, history = box[0]
    assert state.is_completed(), state.message
    first, second = history
    assert (first["category"], first["decision"]["retry"]) == ("preempted", True)
    assert (first["root_cause"]["index"], first["root_cause"]["pod"]) == (1, victim["metadata"]["name"])
    assert first["root_cause"]["first_error_at"] and {v["index"] for v in first["victims"]} == {0}
    assert second["resumed_from"] and second["resumed_from"].startswith("/trainguard/checkpoints/mn-evict-1/step-")
    entries = both_pods(kb, "mn-evict-1", 1)
    assert entries[1]["reason"] == "Evicted"
    assert "resumed from /trainguard/checkpoints/mn-evict-1/step-" in kept(
        kb["evidence"], "mn-evict-1", 2, "tasks/1/logs/train-mn-evict-1-attempt-2.log")
    assert "step 60 loss" in kept(kb["evidence"], "mn-evict-1", 2, "logs/train-mn-evict-1-attempt-2.log")


def test_a_gpu_fault_on_rank_3_keeps_only_its_node_off_the_next_attempt(sim: Any, prefect_server: str,
                                                                        tmp_path: Path) -> None:
    kb = kube_blocks(sim, tmp_path, master_port=rendezvous_port(), one_pod_per_node=True)
    spec = ddp("mn-xid", "--fault", "xid", "--fault-rank", "3", "--fault-attempts", "1", "--steps", "4")
    state, history = run(spec, kb, "mn-xid-1")
    assert state.is_completed(), state.message
    first, second = history
    assert (first["category"], first["decision"]["retry"]) == ("gpu_fault", True)
    entries = both_pods(kb, "mn-xid-1", 1)
    culprit, victim = entries[1]["node"], entries[0]["node"]
    assert culprit != victim  # one pod per node: the victim's node is a different one, and stays usable
    assert (first["root_cause"]["index"], first["root_cause"]["node"]) == (1, culprit)
    assert first["decision"]["avoid_nodes"] == [culprit] and second["avoided_nodes"] == [culprit]
    again = both_pods(kb, "mn-xid-1", 2)
    assert {again[0]["node"], again[1]["node"]} == {victim}
    # two pods, one node left: one pod per node became preferred, and the report says so
    assert "one pod per node was relaxed to preferred" in (second["placement"] or "")
    report = render_attempt(AttemptSummary.from_dict(second))
    assert f"| kept off | {culprit}" in report and "| placement | one pod per node was relaxed" in report


def test_a_hang_is_named_on_its_rank_from_the_stacks_retried_once_and_then_the_run_stops(kb: dict[str, Any]) -> None:
    """Rank 3 stops in the training loop; the others wait in DDP's all-reduce until gloo's 20 s timeout.

    Each pod's entrypoint takes its ranks' stacks at most of the 22 s stall window, while they are
    still alive (at about 17.6 s of silence): the three that wait and the one that does not.
    """
    spec = ddp("mn-hang", "--fault", "hang", "--fault-rank", "3", "--timeout-seconds", "20", "--steps", "6",
               stall_seconds=22)
    state, history = run(spec, kb, "mn-hang-1")
    assert state.is_failed() and len(history) == 2
    first, second = history
    assert (first["category"], first["decision"]["retry"]) == ("hang", True), [first["category"], first["rule_id"]]
    assert (second["category"], second["decision"]["retry"]) == ("hang", False)
    for summary in (first, second):
        entries = both_pods(kb, "mn-hang-1", summary["attempt"])
        assert (summary["root_cause"]["rank"], summary["root_cause"]["index"]) == (3, 1)
        assert summary["root_cause"]["node"] == entries[1]["node"]
        rows = {row["rank"]: row for row in summary["stacks"]["rows"]}
        assert rows[3]["differs"].startswith("meet (train_ddp.py:") and sorted(rows) == [0, 1, 2, 3]
    assert "the same failure signature" in second["decision"]["reason"]  # the same frame again


def test_a_stalled_attempt_of_two_pods_is_judged_by_its_stall(kb: dict[str, Any]) -> None:
    """Every rank goes silent in the same place after its first step (a step that never ends): the stall
    window ends the attempt with both pods still running. Neither pod's own evidence says it failed, and
    the ranks' stacks name no odd one out; the attempt's outcome says it stalled, and the verdict does."""
    spec = ddp("mn-stall", "--steps", "3", "--step-seconds", "3600", script=EXAMPLE, stall_seconds=25,
               retry={"max_total_attempts": 1})
    state, history = run(spec, kb, "mn-stall-1")
    assert state.is_failed() and len(history) == 1
    only = history[0]
    assert only["termination_reason"] == "Stalled"
    assert (only["category"], only["rule_id"], only["retryable"]) == ("timeout", "reason.deadline", True), only
    entries = both_pods(kb, "mn-stall-1", 1)
    assert "step 1 loss" in kept(kb["evidence"], "mn-stall-1", 1, "logs/train-mn-stall-1-attempt-1.log")
    assert [entries[i]["exit_code"] for i in (0, 1)] == [None, None]  # both still running when it was judged
    # the stall is the attempt's, told on the pod the attempt ended on: node 0, as no pod failed first
    assert (only["root_cause"]["index"], only["root_cause"]["rule_id"]) == (0, "reason.deadline")
    assert only["root_cause"]["pod"] == entries[0]["pod"]
    stacks = only["stacks"]  # taken while the ranks were alive: all four in the same place
    assert (stacks["kind"], stacks["culprits"], stacks["ranks"]) == ("undetermined", [], 4), stacks


def test_a_flow_killed_mid_attempt_and_run_again_adopts_the_job_and_its_service(kb: dict[str, Any], sim: Any,
                                                                                prefect_server: str) -> None:
    spec = ddp("mn-adopt", "--steps", "40", "--step-seconds", "0.1", script=EXAMPLE)
    sim.clear_requests()
    code = ("from flows.attempt import train_attempt; from trainguard.core.spec import parse_spec; "
            f"train_attempt(parse_spec({spec!r}), attempt=1, run_id='mn-adopt-1', "
            f"backend_block={kb['backend_block']!r}, evidence_block={kb['evidence_block']!r})")
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": os.pathsep.join(sys.path)}
    first = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: pod_at(kb, "mn-adopt-1", 1, 0) and pod_at(kb, "mn-adopt-1", 1, 1), timeout=240,
                 what="both pods of attempt 1 running")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    from flows.attempt import train_attempt

    state = train_attempt(parse_spec(spec), attempt=1, run_id="mn-adopt-1", backend_block=kb["backend_block"],
                          evidence_block=kb["evidence_block"], return_state=True)
    assert state.is_completed(), state.message
    ns = kb["namespace"]
    assert [c["code"] for c in sim.requests(verb="create", resource="jobs", namespace=ns)] == [201, 409]
    assert [c["code"] for c in sim.requests(verb="create", resource="services", namespace=ns)] == [201, 409]
    both_pods(kb, "mn-adopt-1", 1)
    assert calls(sim, ns) <= allowed_by_rbac(ns), calls(sim, ns) - allowed_by_rbac(ns)


def test_a_pytorchjob_attempt_finds_rank_2_s_code_error_on_its_first_worker(sim: Any, prefect_server: str,
                                                                            tmp_path: Path) -> None:
    """The same attempt as a Kubeflow PyTorchJob (kubesim emulates the training operator): the operator
    names the rendezvous and the pods; the evidence and the root cause are the Indexed Job's."""
    kb = kube_blocks(sim, tmp_path, master_port=rendezvous_port(), job_kind="PyTorchJob")
    sim.clear_requests()
    spec = ddp("mn-ptj", "--fault", "shape", "--fault-rank", "2", "--timeout-seconds", "30")
    state, history = run(spec, kb, "mn-ptj-1")
    assert state.is_failed() and len(history) == 1
    only = history[0]
    assert (only["category"], only["decision"]["retry"]) == ("code_error", False)
    name = manifests.job_name("mn-ptj-1", 1)
    entries = both_pods(kb, "mn-ptj-1", 1, service=f"{name}-master-0", container="pytorch")
    assert [entries[0]["pod"], entries[1]["pod"]] == [f"{name}-master-0", f"{name}-worker-0"]
    assert (only["root_cause"]["index"], only["root_cause"]["rank"], only["root_cause"]["pod"]) == (
        1, 2, f"{name}-worker-0")
    assert {v["index"] for v in only["victims"]} >= {0}
    job = kept(kb["evidence"], "mn-ptj-1", 1, "kubernetes/job.json")
    assert (job["kind"], job["spec"]["runPolicy"]["backoffLimit"], job["spec"]["runPolicy"]["cleanPodPolicy"]) == (
        "PyTorchJob", 0, "None")
    assert {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()} == {"Never"}
    assert "mat1 and mat2 shapes cannot be multiplied" in str(
        kept(kb["evidence"], "mn-ptj-1", 1, "tasks/1/torchelastic/error.json"))
    ns = kb["namespace"]
    assert calls(sim, ns) <= allowed_by_rbac(ns), calls(sim, ns) - allowed_by_rbac(ns)


def test_rank_3_of_2x2_killed_in_step_17_resumes_at_step_16_from_a_survivors_checkpoint(kb: dict[str, Any],
                                                                                         sim: Any) -> None:
    """The training-side helper across pods: rank 3 (index 1) is SIGKILLed in step 17 of attempt 1;
    a survivor saves step 16 on the shared checkpoint volume and both pods of attempt 2 start there."""
    spec = ddp("mn-jit", "--steps", "24", "--checkpoint-every", "10", "--kill-rank", "3", "--kill-at-step", "17",
               script=EXAMPLE)
    state, history = run(spec, kb, "mn-jit-1")
    assert state.is_completed(), state.message
    first, second, *after = history
    if after:  # gloo's teardown can abort a rank at exit once every step is done ("terminate called without an
        # active exception"): a native crash, retried from step 20; only that may follow the attempt under test
        assert len(after) == 1 and second["category"] == "native_crash", second
        assert "step 24 loss" in kept(kb["evidence"], "mn-jit-1", 2, "logs/train-mn-jit-1-attempt-2.log")
    assert first["root_cause"]["index"] == 1 and first["decision"]["retry"]
    assert second["resumed_from"] == "/trainguard/checkpoints/mn-jit-1/step-000016.pt"
    folder = sim.root / "pvc" / kb["namespace"] / "trainguard-checkpoints" / "mn-jit-1"
    ack = json.loads((folder / ".trainguard-acks" / "step-000016.pt.json").read_text())
    assert (ack["kind"], ack["step"], ack["world_size"]) == ("just_in_time", 16, 4) and ack["saved_by_rank"] in (0, 1, 2)
    for log in ("logs/train-mn-jit-1-attempt-2.log", "tasks/1/logs/train-mn-jit-1-attempt-2.log"):
        assert "resumed from /trainguard/checkpoints/mn-jit-1/step-000016.pt at step 16" in kept(
            kb["evidence"], "mn-jit-1", 2, log)
