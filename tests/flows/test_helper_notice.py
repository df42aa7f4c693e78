"""SIGTERM to `trainguard run` reaches the training as a notice: the ranks agree on a step, rank 0 saves
it with an acknowledgement before the deadline, and `--resume` goes on from exactly that step.

Real processes and real signals (the CLI, the entrypoint, torchrun, two gloo ranks) against the
session's Prefect server.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import yaml
from test_cli_stops import start
from waiting import wait_for

from trainguard_entrypoint import acks
from trainguard_entrypoint.notice import read_notice

ROOT = Path(__file__).resolve().parents[2]
GUARDED = str(ROOT / "tests" / "pytorch" / "scripts" / "train_guarded.py")


def spec(steps: int, step_seconds: float) -> dict[str, object]:
    return {"name": "notice", "command": [sys.executable, "-m", "torch.distributed.run", GUARDED, "--steps", str(steps),
                                          "--checkpoint-every", "10", "--step-seconds", str(step_seconds)],
            "processes_per_node": 2, "retry": {"max_attempts": 3, "delay_seconds": 0}}


def test_sigterm_to_trainguard_run_saves_the_agreed_step_and_resume_starts_there(prefect_server, tmp_path) -> None:
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec(100_000, 0.05)))
    cli = start(tmp_path, "run", "run.yaml", api_url=prefect_server)
    runs = tmp_path / "trainguard-data/work/runs"
    wait_for(lambda: list(runs.glob("*/checkpoints/step-000010.pt")), 240, "the first periodic checkpoint")
    run_dir = next(runs.iterdir())
    checkpoints = run_dir / "checkpoints"

    cli.send_signal(signal.SIGTERM)
    out, err = cli.communicate(timeout=180)

    assert cli.returncode == 143, out[-3000:] + err[-3000:]
    noticed = [ack for ack in acks.read_acks(checkpoints).values() if ack.kind == "notice"]
    assert len(noticed) == 1, acks.read_acks(checkpoints)
    ack = noticed[0]
    assert ack.step >= 10 and ack.checkpoint == f"step-{ack.step:06d}.pt" and ack.saved_by_rank == 0
    assert acks.verify(checkpoints, ack) is None
    notice = read_notice(run_dir / "attempt-1" / "notice.json")
    assert notice is not None and notice.reason == "terminated" and ack.notice == notice.to_json()
    assert ack.seconds_from_notice is not None and ack.written_at <= notice.deadline
    progress = acks.read_progress(checkpoints)
    assert progress is not None and progress.step == ack.step  # no rank went past the step saved

    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec(ack.step + 3, 0.0)))
    resumed = start(tmp_path, "run", "run.yaml", "--resume", run_dir.name, api_url=prefect_server)
    out, err = resumed.communicate(timeout=240)

    assert resumed.returncode == 0, out[-3000:] + err[-3000:]
    second = json.loads((tmp_path / "trainguard-data/evidence/runs" / run_dir.name / "attempt-2/verdict.json").read_text())
    assert Path(second["resumed_from"]).name == ack.checkpoint
    log = next((run_dir / "attempt-2" / "logs").glob("train-*.log")).read_text()
    assert f"rank 0 starts at step {ack.step}" in log and f"rank 1 starts at step {ack.step}" in log
