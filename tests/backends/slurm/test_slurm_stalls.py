"""The stall window on a real single-node Slurm: progress in files counts, a real stall keeps its stacks.

A job that writes only to a file under `PET_LOG_DIR` is not silent: its entrypoint stamps
`progress.json` on the shared folder, which the supervisor reads beside the log. A job that is
silent everywhere is cancelled as Stalled, and only after every rank's stack is on record, since
scancel's SIGTERM reaches every process of the step at once.
"""

from __future__ import annotations

import json
import sys

from slurm_helpers import run

FILE_WRITER = ("import os, time\n"
               "path = os.path.join(os.environ['PET_LOG_DIR'], 'rank-0.log')\n"
               "os.makedirs(os.path.dirname(path), exist_ok=True)\n"
               "for step in range(40):\n"
               "    with open(path, 'a') as fh: fh.write(f'step {step}\\n')\n"
               "    time.sleep(0.5)\n")
SILENT = ("import time\n"
          "def stuck_in_a_deadlock():\n"
          "    time.sleep(600)\n"
          "stuck_in_a_deadlock()\n")


def test_a_job_writing_only_to_its_rank_log_outlives_a_shorter_stall_window_on_slurm(slurm_blocks) -> None:
    spec = {"name": "slurm-quiet", "command": [sys.executable, "-c", FILE_WRITER], "stall_seconds": 8,
            "retry": {"max_total_attempts": 1, "delay_seconds": 0}}
    state, history = run(spec, slurm_blocks, "slurm-quiet-1")
    assert state.is_completed(), state.message
    assert history[0]["duration_seconds"] > 16  # the window came and went twice over in silence on the console
    assert "rank-0.log" in (slurm_blocks["shared"] / "runs" / "slurm-quiet-1" / "attempt-1" / "progress.json").read_text()


def test_a_silent_job_is_cancelled_as_stalled_with_its_stack_in_the_evidence(slurm_blocks) -> None:
    spec = {"name": "slurm-silent", "command": [sys.executable, "-c", SILENT], "stall_seconds": 8,
            "retry": {"max_total_attempts": 1, "delay_seconds": 0}}
    state, history = run(spec, slurm_blocks, "slurm-silent-1")
    assert state.is_failed() and history[0]["termination_reason"] == "Stalled", history
    stacks = slurm_blocks["evidence"] / "runs" / "slurm-silent-1" / "attempt-1" / "stacks"
    index = json.loads((stacks / "index.json").read_text())
    assert index["ranks"]["0"].get("file"), index
    assert "stuck_in_a_deadlock" in (stacks / index["ranks"]["0"]["file"]).read_text()
