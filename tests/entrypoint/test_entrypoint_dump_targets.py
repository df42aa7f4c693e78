"""The faulthandler fallback signals only processes that run the site's handler, reaching Python under a wrapper.

SIGUSR2 ends a process that does not handle it and runs the handler of one that has its own. The
stacks are taken here without py-spy (a path where none is), as on a machine without it, from real
processes started with the environment the entrypoint gives the command (`faulthandler_site`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard_entrypoint import stacks

NO_PY_SPY = "/nonexistent/py-spy"
# "ready" comes from inside waits_here: a stack taken once it is read always holds that frame
WAITER = "import time\ndef waits_here():\n    print('ready', flush=True)\n    time.sleep(600)\nwaits_here()\n"
REQUEUE = ("import os, signal, sys, time\n"
           "def requeue(signum, frame):\n"
           "    open(sys.argv[1], 'w').write('requeued')\n"
           "signal.signal(signal.SIGUSR2, requeue)\n"
           "print('ready', flush=True)\ntime.sleep(600)\n")


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _start(started: list[subprocess.Popen[str]], tmp_path: Path, argv: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, **stacks.faulthandler_site(tmp_path, os.environ)}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True)
    started.append(process)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def test_a_shell_wrapping_python_is_not_signalled_and_its_python_child_gives_the_stack(started, tmp_path) -> None:
    shell = shutil.which("bash") or "/bin/sh"
    wrapper = _start(started, tmp_path, [shell, "-c", f"{sys.executable} -c {shlex.quote(WAITER)}; echo after"])

    index = stacks.capture(wrapper.pid, tmp_path, budget_seconds=20, py_spy=NO_PY_SPY, why="by hand")

    entry = index["ranks"]["0"]
    assert entry["source"] == "faulthandler", entry
    assert "waits_here" in (tmp_path / "stacks" / entry["file"]).read_text()
    assert wrapper.poll() is None, f"the shell ended with {wrapper.returncode} (SIGUSR2 is 140 in a shell)"


def test_a_process_with_its_own_sigusr2_handler_is_not_signalled(started, tmp_path) -> None:
    flag = tmp_path / "requeued"
    process = _start(started, tmp_path, [sys.executable, "-c", REQUEUE, str(flag)])

    index = stacks.capture(process.pid, tmp_path, budget_seconds=10, py_spy=NO_PY_SPY, why="by hand")

    assert "a SIGUSR2 handler of its own" in index["ranks"]["0"]["absent"]
    assert stacks.catches(process.pid, signal.SIGUSR2), "it does handle SIGUSR2: the kernel says so"
    assert not flag.exists() and process.poll() is None


@pytest.mark.parametrize("flag", ["-I", "-E", "-S"])
def test_python_that_never_ran_the_site_is_not_signalled(started, tmp_path, flag: str) -> None:
    process = _start(started, tmp_path, [sys.executable, flag, "-c", WAITER])
    (tmp_path / "stacks" / "faulthandler.txt").touch()  # as the command's other Python processes make it

    index = stacks.capture(process.pid, tmp_path, budget_seconds=10, py_spy=NO_PY_SPY, why="by hand")

    assert "not signalled: no process of this rank runs" in index["ranks"]["0"]["absent"], index["ranks"]["0"]
    assert process.poll() is None

