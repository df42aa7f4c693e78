"""A stop with warning on Kubernetes: node index 1 of a 2-node attempt evicted through the Eviction API
with its termination grace, against kubesim, through the flows.

The path under test is the one a cluster takes: the API adds `DisruptionTarget` and deletes the pod
gracefully; the kubelet sends SIGTERM to the container's PID 1 (the entrypoint) and SIGKILL at the
grace's end; the entrypoint writes the notice (deadline: the grace's end, from the pod's
terminationGracePeriodSeconds) and passes SIGTERM on to torchrun, which passes it to its rank. The
ranks (real PyTorch over gloo, examples/ddp/train.py under the training-side helper) agree on one
step, rank 0 saves it and acknowledges it, and every rank stops. The flow records the stop as the
platform's (`preempted`), its verdict records the checkpoint's kind and the steps lost (the lister pod
read the acknowledgement on the volume), and the next attempt resumes from that checkpoint. kubesim keeps grace
periods real here (grace_scale 1.0): the notice's deadline is a wall-clock time the save is held to.
The GPUs are the one stand-in (kubesim's nodes advertise nvidia.com/gpu; the ranks run on the CPU).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from simfixtures import sim_fixture
from flow_helpers import run
from kube_helpers import kept, kube_blocks
from trainguard.core import ids
from trainguard.core.backends.kubernetes import indexed, manifests
from trainguard_entrypoint import acks
from trainguard_entrypoint.notice import read_notice
from services.ports import rendezvous_port
from waiting import wait_for

sim = sim_fixture(grace_scale=1.0)
EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "ddp" / "train.py")
RUN_ID = "kn-evict-1"



def running_pod(kb: dict[str, Any], attempt: int, index: int) -> dict[str, Any] | None:
    for pod in kb["api"].list_pods(kb["namespace"], manifests.selector(RUN_ID, attempt))["items"]:
        if indexed.index_of(pod) == index and pod["status"].get("phase") == "Running":
            return dict(pod)
    return None


def progress_step(checkpoints: Path) -> int | None:
    """The step rank 0 last recorded in attempt 1 (`.trainguard-acks/progress.json`)."""
    progress = acks.read_progress(checkpoints)
    return progress.step if progress is not None and progress.attempt == "1" else None


def test_node_1_evicted_with_grace_saves_the_agreed_step_and_the_next_attempt_resumes_there(
        sim: Any, prefect_server: str, tmp_path: Path) -> None:
    kb = kube_blocks(sim, tmp_path, master_port=rendezvous_port(), survivor_grace_seconds=30, stack_sweep_seconds=5)
    spec = {"name": "kn-evict", "nodes": 2, "processes_per_node": 1, "gpus": 1, "notice_grace_seconds": 30,
            "retry": {"delay_seconds": 0},
            "command": ["python", "-m", "torch.distributed.run", EXAMPLE, "--steps", "60",
                        "--checkpoint-every", "1000", "--step-seconds", "0.1"]}  # no periodic checkpoint
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(run(spec, kb, RUN_ID)), daemon=True)
    thread.start()
    checkpoints = sim.root / "pvc" / kb["namespace"] / "trainguard-checkpoints" / RUN_ID
    wait_for(lambda: (progress_step(checkpoints) or 0) >= 5, timeout=300, what="attempt 1 past step 5")
    victim = wait_for(lambda: running_pod(kb, 1, 1), timeout=30, what="index 1's pod running")
    grace = victim["spec"]["terminationGracePeriodSeconds"]
    assert grace == 30 + 5  # the spec's notice grace, plus the stack sweep the entrypoint runs first
    kb["api"].core.create_namespaced_pod_eviction(victim["metadata"]["name"], kb["namespace"], {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": victim["metadata"]["name"], "namespace": kb["namespace"]}})
    thread.join(600)
    assert not thread.is_alive(), "the run did not end within 600s"
    state, history = box[0]
    assert state.is_completed(), state.message
    first, second = history

    # the stop is the platform's, on node index 1, and retried
    assert (first["category"], first["decision"]["retry"]) == ("preempted", True)
    assert first["root_cause"]["index"] == 1

    # node 1's entrypoint gave the notice on the kubelet's SIGTERM, the deadline before the SIGKILL
    attempt_1 = sim.root / "pvc" / kb["namespace"] / "trainguard-attempts" / ids.attempt_path(RUN_ID, 1)
    notice = read_notice(attempt_1 / "tasks" / "1" / "notice.json")
    assert notice is not None and notice.reason == "terminated"
    # given when the SIGTERM came; the spec's 30 s counted from after the stacks, within the pod's grace
    assert 30 <= notice.deadline - notice.given_at <= grace
    assert read_notice(attempt_1 / "notice.json") is None  # node 0 was never stopped: it learnt by agreement

    # exactly one notice checkpoint, acknowledged, of the step the ranks agreed on
    saved = {name: ack for name, ack in acks.read_acks(checkpoints).items()}
    notices = [ack for ack in saved.values() if ack.kind == "notice"]
    assert len(notices) == 1, saved
    ack = notices[0]
    assert acks.verify(checkpoints, ack) is None
    assert ack.step >= 5 and ack.notice is not None and ack.notice["reason"] == "terminated"
    assert ack.seconds_from_notice is not None and 0 <= ack.seconds_from_notice <= grace

    # the verdict knows it: the checkpoint lister read its acknowledgement and the helper's progress on the volume
    assert (first["newest_checkpoint_kind"], first["newest_checkpoint_step"]) == ("notice", ack.step)
    assert first["notice_to_ack_seconds"] == ack.seconds_from_notice
    assert first["progress_step"] is not None and first["progress_step"] >= 5
    assert first["steps_lost"] == max(0, first["progress_step"] - ack.step) == 0  # saved at the step it stopped
    assert (second["resumed_from_kind"], second["resumed_from_step"]) == ("notice", ack.step)

    # the next attempt resumed from it, at its step
    assert second["resumed_from"] == f"/trainguard/checkpoints/{RUN_ID}/{ack.checkpoint}"
    log_0 = kept(kb["evidence"], RUN_ID, 2, f"logs/train-{RUN_ID}-attempt-2.log")
    assert f"resumed from /trainguard/checkpoints/{RUN_ID}/{ack.checkpoint} at step {ack.step}" in log_0
    assert f"step {ack.step + 1} loss" in log_0 and "step 60 loss" in log_0
    assert f"step {ack.step} loss" not in log_0  # no step done twice
