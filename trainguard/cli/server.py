"""The temporary Prefect server `trainguard run` starts when no PREFECT_API_URL is set.

Prefect starts it as a child process and stops it at exit; a CLI killed with SIGKILL never gets to
exit, so the server would run on forever. A small watchdog process, started beside it, ends the
server as soon as the CLI is gone, however it went. Nothing else about running flows belongs here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect.server.api.server import SubprocessASGIServer

# stdlib only and tiny: it must start fast and outlive nothing but its own check
_WATCHDOG = """
import os, signal, sys, time
def started(pid):
    # a pid names one process only together with its start time: a reused pid starts later
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields[19]
cli, server = int(sys.argv[1]), int(sys.argv[2])
cli_start, server_start = started(cli), started(server)
alive = lambda pid, start: start is not None and started(pid) == start
while alive(cli, cli_start) and alive(server, server_start):
    time.sleep(0.2)
if alive(server, server_start):
    os.kill(server, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while alive(server, server_start) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(server, server_start):
        os.kill(server, signal.SIGKILL)
"""


class _OwnSession(subprocess.Popen):  # type: ignore[type-arg]
    """A Popen whose child leads a session (and process group) of its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "start_new_session": True})


def server_alive(pid: int) -> bool:
    """Whether the temporary server ``pid`` still runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def start_temporary_server() -> int | None:
    """Start Prefect's temporary server now (if one is needed) with a watchdog; return its pid.

    Returns None when ``PREFECT_API_URL`` points at a server someone else runs.
    """
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the same instance Prefect's client would start on first use
    if server.running and server.server_process is not None:
        return server.server_process.pid  # started (and watched) by an earlier call
    timeout = int(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
    # A terminal's Ctrl-C signals the whole foreground process group, the server too: it would shut
    # down while the CLI still records the stopped attempt through it. The server starts with SIGINT
    # blocked (a child inherits the signal mask, and uvicorn never unblocks it); it still ends on
    # SIGTERM, from Prefect at exit or from the watchdog.
    # A SIGTERM to the whole group (a wrapper script's trap, `kill -- -PGID`) would end it just the same:
    # it starts in a session of its own, so only Prefect at exit and the watchdog stop it.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    popen, subprocess.Popen = subprocess.Popen, _OwnSession  # type: ignore[misc]  # Prefect's own Popen call
    try:
        # Prefect read its settings when imported; the bound set in the environment since (the CLI's
        # default for a first start that migrates a new database) reaches it only as an argument.
        server = _start_ours(server, timeout)
    finally:
        subprocess.Popen = popen  # type: ignore[misc]
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if server.server_process is None:
        return None
    pid = server.server_process.pid
    subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(pid)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return pid


COLLISIONS = 3  # ports taken from under a new server before giving up


def _start_ours(server: SubprocessASGIServer, timeout: int) -> SubprocessASGIServer:
    """Start ``server`` and make sure the server answering on its port is this one.

    Prefect picks a random free port in 8000-9000 and then starts uvicorn, which binds only after the
    app's start-up (seconds): another temporary server started meanwhile (a second `trainguard run` on
    the machine) can take the port first. Prefect's health check is then answered by that one, and this
    run's flows would go to another run's server until it stops. So the port must be held by this
    server's own process; if it is not, that process is stopped and a new one started on another port.
    """
    from prefect.server.api.server import SubprocessASGIServer

    for _ in range(COLLISIONS):
        server.start(timeout=timeout)
        process = server.server_process
        if process is None or server.port is None or _holds(process, server.port, time.monotonic() + timeout):
            return server
        taken = server.port
        server.stop()  # forgets this instance: the next one, the client's too, starts afresh
        server = SubprocessASGIServer()
        print(f"trainguard: port {taken} was taken by another server while the temporary Prefect server "
              f"started; starting it again on another port", file=sys.stderr, flush=True)
    raise RuntimeError(f"the temporary Prefect server's port was taken by another server {COLLISIONS} times")


def _holds(process: subprocess.Popen[Any], port: int, deadline: float) -> bool:
    """Whether ``process`` comes to listen on 127.0.0.1:``port``: False once it ends without (uvicorn
    ends when the port is taken) or at ``deadline``."""
    while time.monotonic() < deadline and process.poll() is None:
        inode = _listening_inode(port)
        if inode is not None and _has_socket(process.pid, inode):
            return True
        time.sleep(0.1)
    return False


def _listening_inode(port: int) -> str | None:
    """The inode of the socket listening on 127.0.0.1:``port`` (``/proc/net/tcp``), if any."""
    local = f"0100007F:{port:04X}"
    try:
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
    except OSError:
        return None
    return next((row[9] for row in rows if len(row) > 9 and row[1] == local and row[3] == "0A"), None)


def _has_socket(pid: int, inode: str) -> bool:
    wanted = f"socket:[{inode}]"
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == wanted:
                return True
        except OSError:
            continue
    return False

