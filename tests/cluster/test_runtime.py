"""The local-process container runtime, driven directly (no API server).

Real processes, real signals, a real memory cgroup where this machine allows one.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import uuid
from pathlib import Path

import pytest

from kubesim import mounts, runtime
from waiting import wait_for

CRI_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z (stdout|stderr) F (.*)$")


def _launch(tmp_path: Path, code: str, **kw: object) -> runtime.Launch:
    return runtime.Launch(
        argv=(sys.executable, "-c", code), env={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path, log_path=tmp_path / "logs" / "0.log", **kw,  # type: ignore[arg-type]
    )


async def _run(launch: runtime.Launch, memory: runtime.MemoryControl | None = None) -> runtime.Exit:
    memory = memory or runtime.MemoryControl(None, "watchdog")
    container = await runtime.Container.start(launch, memory, "c1")
    return await asyncio.wait_for(container.wait(), 20)


def test_output_lands_in_a_cri_log_with_both_streams_and_the_exit_code(tmp_path: Path) -> None:
    code = "import sys; print('hello'); print('oops', file=sys.stderr); sys.exit(3)"
    result = asyncio.run(_run(_launch(tmp_path, code)))
    assert (result.exit_code, result.signal, result.oom_killed) == (3, None, False)
    lines = [CRI_LINE.match(x) for x in (tmp_path / "logs" / "0.log").read_text().splitlines()]
    assert all(lines)
    assert sorted((m.group(1), m.group(2)) for m in lines if m) == [
        ("stderr", "oops"), ("stdout", "hello")]


def test_a_signal_death_reports_128_plus_the_signal(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    result = asyncio.run(_run(_launch(tmp_path, code)))
    assert (result.exit_code, result.signal) == (139, 11)


def test_a_segfault_leaves_a_core_file_in_the_working_directory(tmp_path: Path) -> None:
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern:
        pytest.skip(f"core_pattern {pattern!r} sends cores elsewhere, not to the cwd")
    code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    asyncio.run(_run(_launch(tmp_path, code)))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("core")]


def test_stop_sends_sigterm_and_a_handler_exits_143(tmp_path: Path) -> None:
    # The handler writes with os.write: a print() could land inside the unfinished print('ready')
    # (the test sees 'ready' in the log before that call returns) and fail as a reentrant call.
    code = ("import os, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b'got TERM\\n'), sys.exit(143)))\n"
            "print('ready', flush=True)\ntime.sleep(30)")

    async def scenario() -> runtime.Exit:
        memory = runtime.MemoryControl(None, "watchdog")
        container = await runtime.Container.start(_launch(tmp_path, code), memory, "c1")
        await _wait_for_log(tmp_path / "logs" / "0.log", "ready")
        return await container.stop(5)

    result = asyncio.run(scenario())
    assert result.exit_code == 143
    assert "got TERM" in (tmp_path / "logs" / "0.log").read_text()


# The init process passes the stop on itself (as the entrypoint does, after writing a notice): its
# child learns of it only through SIGUSR1 from the init, sent once the init had its SIGTERM.
# Python runs pending handlers together, so the child ends only after its loop, past both.
CHILD = ("import os, signal, sys, time\n"
         "told = []\n"
         "signal.signal(signal.SIGTERM, lambda *a: os.write(1, b'child got TERM\\n'))\n"
         "signal.signal(signal.SIGUSR1, lambda *a: (os.write(1, b'child got USR1\\n'), told.append(1)))\n"
         "print('child ready', flush=True)\n"
         "while not told:\n    time.sleep(0.05)")
INIT = ("import os, signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]])\n"
        "def stop(*a):\n"
        "    os.write(1, b'init got TERM\\n')\n"
        "    child.send_signal(signal.SIGUSR1)\n"
        "    child.wait()\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(30)")  # not child.wait(): the handler's own wait would block on its lock


def test_stop_sends_sigterm_to_the_init_process_alone(tmp_path: Path) -> None:
    launch = runtime.Launch(argv=(sys.executable, "-c", INIT, CHILD), env={"PATH": "/usr/bin:/bin"},
                            cwd=tmp_path, log_path=tmp_path / "logs" / "0.log")

    async def scenario() -> runtime.Exit:
        memory = runtime.MemoryControl(None, "watchdog")
        container = await runtime.Container.start(launch, memory, "c1")
        await _wait_for_log(tmp_path / "logs" / "0.log", "child ready")
        return await container.stop(10)

    result = asyncio.run(scenario())
    log = (tmp_path / "logs" / "0.log").read_text()
    assert result.exit_code == 143
    # the child's SIGUSR1 came after the init's SIGTERM: a SIGTERM to the group would be there by then
    assert "init got TERM" in log and "child got USR1" in log
    assert "child got TERM" not in log


def test_stop_kills_a_process_that_ignores_sigterm_after_the_grace_period(tmp_path: Path) -> None:
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(30)")

    async def scenario() -> runtime.Exit:
        memory = runtime.MemoryControl(None, "watchdog")
        container = await runtime.Container.start(_launch(tmp_path, code), memory, "c1")
        await _wait_for_log(tmp_path / "logs" / "0.log", "ready")
        return await container.stop(0.3)

    result = asyncio.run(scenario())
    assert (result.exit_code, result.signal) == (137, signal.SIGKILL)


GREEDY = "b = []\nwhile True:\n    b.append(bytearray(8 * 1024 * 1024))\n"


def test_the_kernel_oom_kills_a_container_over_its_cgroup_limit(tmp_path: Path) -> None:
    memory = runtime.MemoryControl.detect(f"kubesim-test-{tmp_path.name}")
    if memory.mode == "watchdog":
        pytest.skip("no writable memory cgroup on this machine")
    try:
        result = asyncio.run(_run(_launch(tmp_path, GREEDY, memory_limit_bytes=64 << 20), memory))
    finally:
        memory.close()
    assert (result.exit_code, result.oom_killed) == (137, True)


def test_the_rss_watchdog_oom_kills_when_no_cgroup_is_available(tmp_path: Path) -> None:
    memory = runtime.MemoryControl(None, "watchdog")
    result = asyncio.run(_run(_launch(tmp_path, GREEDY, memory_limit_bytes=64 << 20), memory))
    assert (result.exit_code, result.oom_killed) == (137, True)


async def _wait_for_log(path: Path, text: str) -> None:
    # the shared wait, in a thread, so the event loop keeps serving the container meanwhile
    await asyncio.to_thread(wait_for, lambda: path.exists() and text in path.read_text(), 4, f"{text!r} in {path}")


def test_volumes_are_bound_at_their_real_path_in_a_private_mount_namespace(
        tmp_path: Path) -> None:
    if not mounts.available():
        pytest.skip("unshare --mount is not permitted here; the path-rewrite fallback applies")
    volume = tmp_path / "volume"
    volume.mkdir()
    target = f"/kubesim-test-{uuid.uuid4().hex[:8]}/ckpt"
    code = ("import os; open('step-7.pt', 'w').write('w'); "
            "print(os.getcwd(), sorted(os.listdir('.')))")
    launch = runtime.Launch(
        argv=(sys.executable, "-c", code), env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
        log_path=tmp_path / "logs" / "0.log", mounts=((str(volume), target),), workdir=target)
    result = asyncio.run(_run(launch))
    assert result.exit_code == 0
    assert (volume / "step-7.pt").read_text() == "w"
    assert f"{target} ['step-7.pt']" in (tmp_path / "logs" / "0.log").read_text()
    # The host only ever sees an empty mount target, and kubesim removes what it created.
    assert not any(Path(target).iterdir())
    mounts.remove_targets()
    assert not Path(target).parent.exists()
