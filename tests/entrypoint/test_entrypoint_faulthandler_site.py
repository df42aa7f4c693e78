"""The faulthandler site the entrypoint puts in front of every Python process of the command.

It must change nothing for the command but one thing: SIGUSR2 appends the process's threads to the
attempt's faulthandler file. The user's own sitecustomize still runs, no "Error in sitecustomize"
is printed, and the signal does not end the process (chaining to the default action would).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from waiting import wait_for

from trainguard_entrypoint import stacks

SCRIPT = """
import sys, time
print("ready", "users_site" in sys.modules, flush=True)
for line in sys.stdin:
    print("alive", flush=True)
"""


def _start(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def test_the_site_keeps_the_users_sitecustomize_and_survives_the_signal(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.mkdir()
    (users / "sitecustomize.py").write_text("import sys\nsys.modules['users_site'] = sys\n")
    env = {**os.environ, "PYTHONPATH": str(users)}
    env.update(stacks.faulthandler_site(tmp_path / "attempt", env))
    dumps = tmp_path / "attempt" / "stacks" / "faulthandler.txt"

    process = _start(tmp_path, env)
    try:
        assert process.stdout is not None and process.stdin is not None
        assert process.stdout.readline().split() == ["ready", "True"]  # the user's site ran too
        os.kill(process.pid, stacks.DUMP_SIGNAL)
        wait_for(lambda: dumps.exists() and "most recent call first" in dumps.read_text(), timeout=20,
                 what="the thread dump in the attempt's faulthandler file")
        process.stdin.write("still there?\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "alive"  # the signal did not end it
        process.stdin.close()
        assert process.wait(timeout=20) == 0
        assert process.stderr is not None
        assert "Error in sitecustomize" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
