"""Slurm's warning before the time limit, on the real test Slurm: `--signal=B:TERM@<notice grace>` reaches
the batch shell, which writes the notice (reason time_limit, the limit as its deadline) into the task's
folder and passes SIGTERM on to the entrypoint, which passes it to torchrun and its ranks. The ranks
(real PyTorch over gloo, examples/ddp/train.py under the training-side helper) agree on a step, rank 0
saves and acknowledges it, and the next attempt resumes there.

The warning comes when Slurm's timer sees it due (up to a minute early),
so how far an attempt gets is not fixed: an attempt warned again resumes the next one the same way,
and the test checks every hand-over, not a count of attempts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from slurm_helpers import run
from trainguard_entrypoint import acks
from trainguard_entrypoint.notice import read_notice

EXAMPLE = str(Path(__file__).resolve().parents[3] / "examples" / "ddp" / "train.py")
RUN_ID = "slurm-notice-1"


def test_the_warning_before_the_time_limit_saves_the_agreed_step_and_the_next_attempt_resumes_there(
        slurm_blocks: dict[str, Any]) -> None:
    # Two minutes, warned 30 s before: Slurm's timer sends it 30 to 90 s after the start, once the
    # ranks train (more than 90 s of steps, so the first attempt is always warned). Every attempt ends
    # the same way (timeout), each with progress: the signature breaker is not what this is about.
    spec = {"name": "slurm-notice", "processes_per_node": 2, "deadline_seconds": 120, "notice_grace_seconds": 30,
            "retry": {"max_attempts": 3, "delay_seconds": 0, "same_signature_limit": 10},
            "command": [sys.executable, "-m", "torch.distributed.run", EXAMPLE, "--steps", "360",
                        "--checkpoint-every", "100000", "--step-seconds", "0.25"]}  # notice checkpoints only
    state, history = run(spec, slurm_blocks, RUN_ID)
    assert state.is_completed(), history
    assert len(history) >= 2, "the first attempt was not warned before its time limit"
    checkpoints = slurm_blocks["shared"] / "runs" / RUN_ID / "checkpoints"
    saved = acks.read_acks(checkpoints)
    by_attempt = {ack.notice["given_at"]: ack for ack in saved.values() if ack.kind == "notice" and ack.notice}
    assert len(by_attempt) == len(history) - 1, saved  # one notice checkpoint per warned attempt
    for number, (warned, after) in enumerate(zip(history, history[1:]), start=1):
        assert warned["termination_reason"] == "DeadlineExceeded", warned
        folder = slurm_blocks["shared"] / "runs" / RUN_ID / f"attempt-{number}"
        notice = read_notice(folder / "notice.json")
        assert notice is not None and notice.reason == "time_limit", notice
        assert "--signal=B:TERM@30" in notice.source
        ack = by_attempt[notice.given_at]
        assert acks.verify(checkpoints, ack) is None and ack.step >= 1
        assert ack.seconds_from_notice is not None and ack.seconds_from_notice < notice.deadline - notice.given_at
        assert after["resumed_from"] and after["resumed_from"].endswith(ack.checkpoint)
        log = (slurm_blocks["shared"] / "runs" / RUN_ID / f"attempt-{number + 1}" / "logs"
               / f"train-{RUN_ID}-attempt-{number + 1}.log").read_text()
        assert f"at step {ack.step}" in log and f"step {ack.step + 1} loss" in log
    assert history[-1]["state"] == "Completed"
