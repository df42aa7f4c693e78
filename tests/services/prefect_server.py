"""A real `prefect server start` in a subprocess, on a loopback port, against a given database.

The server gets its own PREFECT_HOME and UI folder in a temporary directory, so it never writes into
site-packages or the user's profile. Workers the tests start are subprocesses too
(`prefect worker start`), each with its own log file, stopped with their process group.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.ports import free_port

PREFECT = str(Path(sys.executable).with_name("prefect"))


@dataclass(frozen=True)
class PrefectServer:
    """A running server: its API URL and the folder with its log."""

    api_url: str
    folder: Path

    def log(self) -> str:
        return (self.folder / "server.log").read_text(errors="replace")


def quiet_env(api_url: str, **extra: str) -> dict[str, str]:
    """The environment of a Prefect client process talking to `api_url`."""
    return {
        **os.environ,
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **extra,
    }


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def prefect_server(database_url: str, startup_timeout: float = 300.0, *, ui: bool = False) -> Iterator[PrefectServer]:
    """Run a Prefect server on `database_url` until the block exits; with `ui`, it serves the Prefect UI too.

    The first start migrates an empty database: about 20 s on an idle 2-core machine, minutes on a
    loaded one, hence the generous `startup_timeout`.
    """
    folder = Path(tempfile.mkdtemp(prefix="trainguard-prefect-"))
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = quiet_env(
        api_url,
        PREFECT_HOME=str(folder / "home"),
        PREFECT_API_DATABASE_CONNECTION_URL=database_url,
        PREFECT_SERVER_UI_STATIC_DIRECTORY=str(folder / "ui"),
        PREFECT_UI_ENABLED="true" if ui else "false",
        PREFECT_UI_API_URL=api_url,  # what the UI's pages call (its default is port 4200)
        # Many flow runs at once: the default pool (5 + 10 overflow) queues requests behind each other.
        PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_SIZE="20",
        PREFECT_SERVER_DATABASE_SQLALCHEMY_MAX_OVERFLOW="20",
    )
    try:
        with managed_process([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                             folder / "server.log", env):
            server = PrefectServer(api_url, folder)
            deadline = time.monotonic() + startup_timeout
            while not _healthy(api_url):  # the server says nothing else about being ready
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Prefect server not healthy after {startup_timeout:g}s:\n{server.log()[-4000:]}")
                time.sleep(0.2)
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def managed_process(argv: list[str], log: Path, env: dict[str, str], cwd: Path | None = None) -> Iterator[subprocess.Popen]:
    """Run `argv` in its own process group with output to `log`; end the whole group on exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        try:
            yield proc
        finally:
            stop_group(proc)


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the process group `proc` leads, unless that group id may name another's now.

    While the leader is unreaped, or while any member lives, the id stays reserved. Once the leader
    is reaped and its pid names some other process, the group is not ours any more: with a pid space
    of 32768 and a suite that starts thousands of processes, pids come round within minutes.
    """
    if proc.poll() is not None and Path(f"/proc/{proc.pid}").exists():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process group of `proc`, then SIGKILL what is left after `grace` seconds."""
    signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    signal_group(proc, signal.SIGKILL)  # children that outlived their parent, too
    proc.wait(timeout=grace)


@contextlib.contextmanager
def process_workers(count: int, pool: str, api_url: str, folder: Path, cwd: Path,
                    limit: int = 4, **env: str) -> Iterator[list[subprocess.Popen]]:
    """`count` real `prefect worker start --type process` processes polling `pool` through `api_url`."""
    worker_env = quiet_env(api_url, PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_PREFETCH_SECONDS="5", **env)
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(managed_process(
                [PREFECT, "worker", "start", "--pool", pool, "--type", "process", "--name", f"{pool}-w{i}",
                 "--limit", str(limit)],
                folder / f"worker-{i}.log", worker_env, cwd=cwd,
            ))
            for i in range(1, count + 1)
        ]
        yield procs
