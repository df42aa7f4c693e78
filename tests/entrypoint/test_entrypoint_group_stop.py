"""A stop that reaches the entrypoint and its command at once, as `scancel` or `kill -TERM -<pgid>` does.

The entrypoint first tries to take the ranks' stacks (within TRAINGUARD_STACK_SWEEP_SECONDS), but the
rank is already dying of the same SIGTERM: the capture must give up on a process that ended, not
wait out its bound, so the crash report is written before Slurm's KillWait or the pod's grace ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from entrypoint_harness import entrypoint_argv, entrypoint_env, py
from waiting import wait_for

STEPS = "import time\nfor i in range(100000):\n    print('step', i, flush=True); time.sleep(0.05)\n"


def test_a_stop_to_the_whole_group_gets_its_crash_report_well_within_the_sweep_bound(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    log = workspace / "logs" / "train-r1-attempt-1.log"
    env = entrypoint_env({"TRAINGUARD_STACK_SWEEP_SECONDS": "300", "TRAINGUARD_PY_SPY": "/nonexistent/py-spy"})
    entrypoint = subprocess.Popen(entrypoint_argv(workspace, py(STEPS)), env=env, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: log.exists() and "step 5" in log.read_text(), timeout=60, what="the command to run")
        os.killpg(entrypoint.pid, signal.SIGTERM)  # the entrypoint and its command, at once

        # the sweep's bound is 300 s: a capture waiting on the dead rank would still be waiting
        wait_for(lambda: entrypoint.poll() is not None, timeout=60, what="the entrypoint to end")
        assert (workspace / "crash-report.json").exists()
        index = (workspace / "stacks" / "index.json").read_text()
        assert "ended before it could dump its stack" in index, index
    finally:
        if entrypoint.poll() is None:
            os.killpg(entrypoint.pid, signal.SIGKILL)
            entrypoint.wait()
