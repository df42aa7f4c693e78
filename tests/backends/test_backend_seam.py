"""The backend seam's values, the one function that builds the training container's environment, and what
the local backend hands triage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime

import pytest

from trainguard.core import recovery, triage
from trainguard.core.attempt import AttemptSummary, next_parameters
from trainguard.core.backends.base import (
    AttemptOutcome, Backend, Launch, Rendezvous, container_env,
)
from trainguard.core.backends.capabilities import StopsOrphans, Supervises
from trainguard.core.backends.forensics import StackCapture
from trainguard.core.backends.local.runner import _write_process_record
from trainguard.core.backends.local.backend import LocalBackend
from trainguard.core.backends.slurm import continuation
from trainguard.core.backends.slurm.backend import SlurmBackend
from trainguard.core.backends.workspace import AttemptWorkspace
from trainguard.core.policy import RetryDecision
from trainguard.core.stores.folder import LocalEvidenceStore
from trainguard.core.taxonomy import Category
from trainguard.core.triage.signals import Signals
from waiting import wait_for


def _launch(**changes: object) -> Launch:
    fields: dict[str, object] = {"run_id": "r-1", "attempt": 2, "command": ("python", "t.py"),
                                 "env": {"WANDB_PROJECT": "x"}, "resume_from": "/ck/step-5.pt"}
    fields.update(changes)
    return Launch(**fields)  # type: ignore[arg-type]


def test_container_env_adds_trainguards_variables_over_the_users() -> None:
    env = container_env(_launch(env={"WANDB_PROJECT": "x", "TRAINGUARD_ATTEMPT": "9"}),
                        workspace="/ws", checkpoint_dir="/ck", base={"PATH": "/bin"})
    assert env == {
        "PATH": "/bin", "WANDB_PROJECT": "x", "TRAINGUARD_RUN_ID": "r-1", "TRAINGUARD_ATTEMPT": "2",
        "TRAINGUARD_WORKSPACE": "/ws", "TRAINGUARD_RESUME_FROM": "/ck/step-5.pt", "TRAINGUARD_CHECKPOINT_DIR": "/ck",
        "PET_LOG_DIR": "/ws/ranks", "PET_TEE": "3", "TORCHELASTIC_ERROR_FILE": "/ws/torchelastic/error.json",
        "PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29500", "PET_MAX_RESTARTS": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        "NNODES": "1", "NODE_RANK": "0", "WORLD_SIZE": "1",
        "TRAINGUARD_STACK_SWEEP_SECONDS": "30", "TRAINGUARD_STACK_NATIVE": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/ws/flight-recorder/rank_", "TORCH_FR_DUMP_TEMP_FILE": "/ws/flight-recorder/rank_",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/ws/flight-recorder/pipe_",
    }


def test_the_entrypoint_learns_the_stall_window_and_the_sweep_and_the_user_may_size_the_flight_recorder() -> None:
    launch = _launch(stall_seconds=90.0, env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
                                              "TRAINGUARD_STACK_SWEEP_SECONDS": "0"})
    env = container_env(launch, workspace="/ws", checkpoint_dir=None, capture=StackCapture(12.5, native=False))
    assert {k: env[k] for k in ("TRAINGUARD_STALL_SECONDS", "TRAINGUARD_STACK_SWEEP_SECONDS", "TRAINGUARD_STACK_NATIVE",
                                "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")} == {
        "TRAINGUARD_STALL_SECONDS": "90", "TRAINGUARD_STACK_SWEEP_SECONDS": "12.5", "TRAINGUARD_STACK_NATIVE": "0",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/ws/flight-recorder/pipe_"}
    assert StackCapture(12.5).stop_grace(2.0) == 14.5  # a stop waits for the sweep, then the grace period


def test_a_sweep_bound_that_is_no_number_of_seconds_is_one_line_naming_the_field() -> None:
    with pytest.raises(ValueError) as caught:
        StackCapture(float("nan"))
    assert "stack_sweep_seconds" in str(caught.value) and "\n" not in str(caught.value)


def test_every_node_gets_the_rendezvous_and_the_user_cannot_move_it_but_may_keep_the_console_plain() -> None:
    launch = _launch(nodes=4, processes_per_node=8,
                     env={"MASTER_PORT": "1", "PET_TEE": "0", "PET_LOG_DIR": "/mine", "WANDB_PROJECT": "x"})
    env = container_env(launch, workspace="/ws", checkpoint_dir=None,
                        rendezvous=Rendezvous(master_addr="tg-r-1-a2-0.tg-r-1-a2", master_port=29400, node_rank=3))
    assert {k: env[k] for k in ("PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR",
                                "MASTER_PORT", "NODE_RANK", "WORLD_SIZE", "PET_MAX_RESTARTS")} == {
        "PET_NNODES": "4", "PET_NODE_RANK": "3", "PET_NPROC_PER_NODE": "8",
        "PET_MASTER_ADDR": "tg-r-1-a2-0.tg-r-1-a2", "MASTER_PORT": "29400", "NODE_RANK": "3", "WORLD_SIZE": "32",
        "PET_MAX_RESTARTS": "0"}
    assert (env["PET_TEE"], env["PET_LOG_DIR"]) == ("0", "/mine")  # where the logs go stays the user's choice


def test_a_fresh_start_resumes_from_nothing_and_keeps_the_workdir() -> None:
    env = container_env(_launch(resume_from=None, workdir="/src"), workspace="/ws", checkpoint_dir=None)
    assert env["TRAINGUARD_RESUME_FROM"] == "" and env["TRAINGUARD_WORKDIR"] == "/src"
    assert "TRAINGUARD_CHECKPOINT_DIR" not in env


@pytest.mark.parametrize("env, field", [({"A=B": "1"}, "A=B"), ({"A": "x\0y"}, "'A'"), ({"": "1"}, "''")])
def test_container_env_refuses_what_no_process_can_receive_in_one_line(env: dict[str, str], field: str) -> None:
    with pytest.raises(ValueError) as caught:
        container_env(_launch(env=env), workspace="/ws", checkpoint_dir=None)
    assert field in str(caught.value) and "\n" not in str(caught.value)


def test_an_outcome_survives_its_json_form_with_conditions_and_events() -> None:
    outcome = AttemptOutcome(
        exit_code=137, signal=9, reason="OOMKilled", message="killed", node="gpu-3",
        conditions=({"type": "DisruptionTarget", "status": "True"},),
        events=({"reason": "Evicted", "message": "The node was low on memory"},),
    )
    again = AttemptOutcome.from_dict(outcome.to_dict())
    assert again == outcome and not again.succeeded
    assert AttemptOutcome(0, None, "Completed", "ok").succeeded
    assert not AttemptOutcome(0, None, "DeadlineExceeded", "late").succeeded


def test_the_local_backend_is_a_backend(tmp_path) -> None:
    assert isinstance(LocalBackend(tmp_path), Backend)


def test_the_slurm_backend_is_a_backend_that_stops_orphans(tmp_path) -> None:
    backend = SlurmBackend(tmp_path)
    assert isinstance(backend, Backend) and isinstance(backend, StopsOrphans)


def test_next_parameters_carry_the_nodes_to_avoid_and_move_the_lineage_on() -> None:
    summary = AttemptSummary(run_id="r-1", attempt=1, max_attempts=3, state="Failed", flow_run_id="f1",
                             category="gpu_fault", node="gpu-3")
    decision = RetryDecision(True, "gpu_fault is retryable", 2, 0.0, "/ck/step-5.pt", ("gpu-3",))
    params = next_parameters({"spec": {"name": "x"}, "attempt": 1, "backend_block": "b"}, summary, decision, "f1")
    assert params["attempt"] == 2 and params["avoid_nodes"] == ["gpu-3"] and params["parent_flow_run_id"] == "f1"
    assert params["resume_from"] == "/ck/step-5.pt" and params["backend_block"] == "b"
    assert [h["attempt"] for h in params["history"]] == [1] and "memory_factor" not in params


def test_next_parameters_carry_the_memory_factor_the_decision_raised() -> None:
    summary = AttemptSummary(run_id="r-1", attempt=1, max_attempts=3, state="Failed", flow_run_id="f1",
                             category="host_oom", memory_factor=1.5)
    decision = RetryDecision(True, "host_oom is retryable", 2, memory_factor=3.0)
    params = next_parameters({"spec": {"name": "x"}, "attempt": 1, "memory_factor": 1.5}, summary, decision, "f1")
    assert params["memory_factor"] == 3.0 and params["history"][0]["memory_factor"] == 1.5
    assert summary.record().memory_factor == 1.5


def test_a_log_cut_short_by_a_full_disk_is_triaged_with_the_runners_tail_read_after_it(tmp_path) -> None:
    backend = LocalBackend(tmp_path)
    ref = backend.provision("disk-1", 1)
    log = backend.workspace(ref).log_path
    early = ["step 1", "Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
             "TypeError: unsupported operand type(s) for +: 'int' and 'str'"]
    # the disk filled in the middle of "noise 10"; the runner's tail holds the last 200 lines printed
    log.write_text("\n".join([*early, *(f"noise {i}" for i in range(10))]) + "\nnoise 1")
    tail = [f"noise {i}" for i in range(5, 205)]
    outcome = AttemptOutcome(exit_code=1, signal=None, reason="Error", message="exited with code 1",
                             log_path=None, log_tail="\n".join(tail))

    signals = backend.signals(ref, outcome)
    read = signals.log.read().decode()
    signals.log.close()

    assert read == log.read_text() + "\n" + "".join(f"noise {i}\n" for i in range(10, 205))  # 5-9 read once
    diagnosis = triage.classify(backend.signals(ref, outcome))
    assert (diagnosis.category.value, diagnosis.line_number) == ("code_error", 4), diagnosis
    assert triage.classify(Signals(exit_code=1, reason="Error", log=outcome.log_tail)).category.value == "unknown"


def test_local_and_slurm_say_which_attempts_a_run_has_and_who_supervises_them(tmp_path) -> None:
    """Both keep attempt folders on this machine (Slurm's on the shared filesystem) and record their
    supervisor there; a record of a process that has ended never makes an attempt look supervised."""
    local, slurm = LocalBackend(work_root=tmp_path / "work"), SlurmBackend(shared_folder=tmp_path / "shared")
    _write_process_record(AttemptWorkspace.create(local.work_root, "r-a", 2), 4242, datetime.now(UTC))
    continuation.write_job_record(AttemptWorkspace.create(slurm.shared_folder, "r-b", 1), "77", adopted=False)
    AttemptWorkspace.create(slurm.shared_folder, "r-b", 3)  # a folder without a record: nobody follows it
    store = LocalEvidenceStore(tmp_path / "evidence")
    store.put_bytes("runs/r-b/attempt-4/manifest.json", b"{}")
    for backend, run_id, attempts in ((local, "r-a", [2]), (slurm, "r-b", [1, 3])):
        assert isinstance(backend, Supervises)
        assert backend.attempts(run_id) == attempts and run_id in backend.runs()
        assert backend.supervisor_pid(run_id, attempts[0]) == os.getpid()  # this process wrote it
        assert backend.supervisor_pid(run_id, attempts[-1] if len(attempts) > 1 else 9) is None
    assert recovery.attempts_of(slurm, store, "r-b") == [1, 3, 4]

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = AttemptWorkspace.at(slurm.shared_folder, "r-b", 1).root / continuation.JOB_RECORD
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "supervisor_pid": int(ended.stdout)}))
    assert slurm.supervisor_pid("r-b", 1) is None


def test_a_recovery_step_that_lasts_says_what_it_waits_for_and_the_verdict_is_still_kept(tmp_path) -> None:
    """A Ctrl-C on Kubernetes collects, stops and lists through pods of their own, which take minutes under
    load: the recovery says what it waits for while it lasts. Here the checkpoint listing blocks until
    the line naming it has been seen."""
    listed = threading.Event()

    class SlowToList(LocalBackend):
        def checkpoints(self, run_id: str) -> list[str]:
            listed.wait(120)
            return super().checkpoints(run_id)

    backend, store, lines = SlowToList(work_root=tmp_path / "work"), LocalEvidenceStore(tmp_path / "evidence"), []
    begun = AttemptSummary(run_id="r-slow", attempt=1, max_attempts=3, state="Cancelled", gpus=0)
    stop = recovery.Stop(Category.USER_CANCELLED, "trainguard.stop.sigint", "interrupted", "resume")
    result: dict[str, recovery.Recovered] = {}
    worker = threading.Thread(target=lambda: result.update(done=recovery.recover(
        backend, store, begun, judge=stop.judge, decide=lambda summary, points: RetryDecision(False, "stopped"),
        source="cli", say=lines.append)))
    worker.start()
    try:
        wait_for(lambda: any("list the run's checkpoints for attempt 1 of r-slow" in line for line in lines),
                 timeout=60, what="a line about the checkpoint listing")
    finally:
        listed.set()
        worker.join(60)
    assert lines[0].startswith("trainguard: waiting ") and "for the local backend to list" in lines[0], lines
    assert result["done"].summary.category == Category.USER_CANCELLED.value
