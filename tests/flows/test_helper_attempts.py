"""The training-side helper through the attempt flow, with real torch DDP on gloo under torchrun.

One node of four ranks: rank 3 is SIGKILLed in step 17 with periodic checkpoints every 10, and a
survivor's just-in-time checkpoint makes the next attempt resume at step 16, not 10. Each way that
save can fail (its saver dies, it is slower than the survivors' grace, its file is corrupted after
it was acknowledged) falls back to the newest good checkpoint. What is checked is steps and files:
which checkpoint the retry resumed from, the step each rank started at, what each ack says.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from flow_helpers import run
from waiting import wait_for

from trainguard_entrypoint import acks

ROOT = Path(__file__).resolve().parents[2]
GUARDED = str(ROOT / "tests" / "pytorch" / "scripts" / "train_guarded.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def guarded_spec(name: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "command": [*TORCHRUN, GUARDED, "--steps", "24", "--fault", "sigkill", "--fault-rank", "3",
                                      "--fault-step", "17", *args],
            "processes_per_node": 4, "env": env or {}, "retry": {"max_attempts": 3, "delay_seconds": 0}}


def folder(blocks: dict[str, Any], run_id: str) -> Path:
    return blocks["work"] / "runs" / run_id / "checkpoints"


def started_at(blocks: dict[str, Any], run_id: str, attempt: int) -> set[str]:
    log = next((blocks["work"] / "runs" / run_id / f"attempt-{attempt}" / "logs").glob("train-*.log")).read_text()
    return {line.split("starts at step ")[1].split()[0] for line in log.splitlines() if "starts at step " in line}


def test_rank_3_of_4_killed_in_step_17_resumes_at_step_16_from_a_survivors_just_in_time_checkpoint(blocks) -> None:
    state, attempts = run(guarded_spec("jit-1x4"), blocks, "jit-1x4", as_summaries=True)

    judged = [(a.state, a.category, a.rule_id, a.signature) for a in attempts]
    assert state.is_completed() and [a.state for a in attempts] == ["Failed", "Completed"], judged
    first, second = attempts
    assert first.root_cause and first.root_cause["rank"] == 3  # triage still names the culprit
    assert Path(second.resumed_from or "").name == "step-000016.pt"
    assert started_at(blocks, "jit-1x4", 2) == {"16"}
    checkpoints = folder(blocks, "jit-1x4")
    ack = acks.read_ack(checkpoints, "step-000016.pt")
    assert ack is not None and (ack.step, ack.kind, ack.world_size) == (16, "just_in_time", 4)
    assert ack.saved_by_rank in (0, 1, 2) and "Connection" in (ack.failure or "")
    assert ack.seconds_from_failure is not None and acks.verify(checkpoints, ack) is None
    assert [a.kind for a in acks.read_acks(checkpoints).values()].count("just_in_time") == 1  # one saver
    assert sorted(p.name for p in checkpoints.glob("step-*")) == ["step-000010.pt", "step-000016.pt", "step-000020.pt"]


def test_a_survivor_that_dies_during_its_save_leaves_nothing_that_looks_whole_and_the_retry_takes_step_10(blocks) -> None:
    state, attempts = run(guarded_spec("jit-dies", "--save-fault", "die"), blocks, "jit-dies", as_summaries=True)

    assert state.is_completed() and len(attempts) == 2
    assert Path(attempts[1].resumed_from or "").name == "step-000010.pt"
    assert started_at(blocks, "jit-dies", 2) == {"10"}
    checkpoints = folder(blocks, "jit-dies")
    assert not (checkpoints / "step-000016.pt").exists()
    assert acks.read_ack(checkpoints, "step-000016.pt") is None
    assert list(checkpoints.glob(".step-000016.pt.*.tmp"))  # the half-written save, under a name never ranked


def test_a_save_slower_than_the_survivors_grace_is_discarded_and_the_retry_takes_step_10(blocks) -> None:
    spec = guarded_spec("jit-slow", "--save-fault", "slow", "--slow-seconds", "8",
                        env={"TRAINGUARD_NOTICE_GRACE_SECONDS": "2"})
    state, attempts = run(spec, blocks, "jit-slow", as_summaries=True)

    assert state.is_completed() and len(attempts) == 2
    assert Path(attempts[1].resumed_from or "").name == "step-000010.pt"
    checkpoints = folder(blocks, "jit-slow")
    assert not (checkpoints / "step-000016.pt").exists() and acks.read_ack(checkpoints, "step-000016.pt") is None
    log = next((blocks["work"] / "runs" / "jit-slow" / "attempt-1" / "logs").glob("train-*.log")).read_text()
    assert "after the notice's deadline; discarded" in log


def test_a_just_in_time_file_corrupted_after_its_ack_is_passed_over_for_the_newest_good_checkpoint(blocks) -> None:
    """The loop owns its checkpoint code here (`--hook`: its save, `step_done` after each step)."""
    checkpoints = folder(blocks, "jit-corrupt")
    corrupted = threading.Event()

    def corrupt() -> None:  # as soon as the ack exists: long before the flow weighs a retry
        ack = wait_for(lambda: acks.read_ack(checkpoints, "step-000016.pt"), 240, "the just-in-time ack")
        target = checkpoints / ack.checkpoint
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
        corrupted.set()

    watcher = threading.Thread(target=corrupt, daemon=True)
    watcher.start()
    state, attempts = run(guarded_spec("jit-corrupt", "--hook"), blocks, "jit-corrupt", as_summaries=True)
    watcher.join(timeout=5)

    assert corrupted.is_set()
    assert state.is_completed() and len(attempts) == 2
    assert Path(attempts[1].resumed_from or "").name == "step-000010.pt"
    assert started_at(blocks, "jit-corrupt", 2) == {"10"}
    ack = acks.read_ack(checkpoints, "step-000016.pt")
    assert ack is not None and acks.verify(checkpoints, ack) == "step-000016.pt: SHA-256 differs from the acknowledgement's"


def test_the_lightning_callback_saves_from_the_survivor_and_the_retry_resumes_at_that_step(blocks) -> None:
    script = str(ROOT / "tests" / "pytorch" / "scripts" / "train_lightning_guarded.py")
    spec = {"name": "jit-lightning", "command": [*TORCHRUN, script, "--kill-rank", "1", "--kill-step", "13"],
            "processes_per_node": 2, "retry": {"max_attempts": 3, "delay_seconds": 0}}
    state, attempts = run(spec, blocks, "jit-lightning", as_summaries=True)

    assert state.is_completed() and len(attempts) == 2
    assert Path(attempts[1].resumed_from or "").name == "step-000012.ckpt"
    assert started_at(blocks, "jit-lightning", 2) == {"12"}
    checkpoints = folder(blocks, "jit-lightning")
    ack = acks.read_ack(checkpoints, "step-000012.ckpt")
    assert ack is not None and (ack.step, ack.kind, ack.saved_by_rank) == (12, "just_in_time", 0)
    assert acks.verify(checkpoints, ack) is None
