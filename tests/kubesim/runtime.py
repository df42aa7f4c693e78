"""Local-process container runtime for kubesim's kubelets.

What belongs here: starting one container instance as a host process in its own
process group, writing its stdout/stderr as a CRI-format log file (lines over 16 KiB, and a
line still being written, as partial records), enforcing its
memory limit (a cgroup v1/v2 memory controller where one is writable, else an RSS
watchdog), keeping core files (RLIMIT_CORE unlimited, cwd = the container's folder),
and stopping it the way a container runtime does (SIGTERM, grace, SIGKILL).

What does not: anything about pods, the API objects or events (that is kubelet.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from kubesim import mounts

log = logging.getLogger("kubesim.runtime")

_CGROUP_FS = Path("/sys/fs/cgroup")
# containerd's max_container_log_line_size: a longer line is split into partial (P) records that
# the log endpoint joins again.
MAX_LOG_LINE_BYTES = 16 * 1024
# The shell joins the cgroup before exec so the workload is limited from its first
# allocation, and raises RLIMIT_CORE so crashes leave a core file in the cwd.
# In a private mount namespace it then binds each volume at its real mountPath and enters
# the workingDir, so the workload sees the paths its spec names.
# Arguments: cgroup.procs path or "", workingDir or "", number of mounts, (source, target)*,
# then the command.
_WRAPPER = (
    '[ -n "$1" ] && { echo $$ > "$1" || exit 125; }; wd=$2; n=$3; shift 3; '
    'while [ "$n" -gt 0 ]; do mount --bind "$1" "$2" || exit 125; shift 2; n=$((n-1)); done; '
    '[ -n "$wd" ] && { cd "$wd" || exit 125; }; '
    'ulimit -c unlimited 2>/dev/null; exec "$@"'
)
_WATCHDOG_PERIOD_SECONDS = 0.05
_INIT_POLL_SECONDS = 0.25


def rfc3339nano(moment: datetime | None = None) -> str:
    """Timestamps as the CRI log format writes them (nanosecond precision, Z)."""
    ns = time.time_ns() if moment is None else int(moment.timestamp() * 1e9)
    secs, frac = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{frac:09d}Z"


@dataclass(frozen=True)
class Launch:
    """What to run for one container instance."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    log_path: Path
    memory_limit_bytes: int | None = None
    name: str = "container"
    # (path inside the container, host path) bound in a private mount namespace.
    mounts: tuple[tuple[str, str], ...] = ()
    workdir: str = ""


@dataclass(frozen=True)
class Exit:
    """How a container instance ended, in the terms the kubelet reports."""

    exit_code: int
    signal: int | None
    oom_killed: bool
    started_at: datetime
    finished_at: datetime


class MemoryControl:
    """Finds a writable memory controller once and makes one child cgroup per container.

    `mode` is "cgroup-v1", "cgroup-v2" or "watchdog" (the loud fallback).
    """

    def __init__(self, base: Path | None, mode: str) -> None:
        self.base = base
        self.mode = mode

    @classmethod
    def detect(cls, tag: str | None = None) -> MemoryControl:
        tag = tag or f"kubesim-{os.getpid()}"
        for mode, parent in _candidate_parents():
            base = parent / tag
            try:
                _sweep_stale(parent)
                base.mkdir(exist_ok=True)
                if mode == "cgroup-v2":
                    (base / "cgroup.subtree_control").write_text("+memory")
                probe = base / "probe"
                probe.mkdir(exist_ok=True)
                probe.rmdir()
            except OSError as exc:
                log.debug("memory cgroup at %s not usable: %s", parent, exc)
                continue
            return cls(base, mode)
        log.warning(
            "kubesim: no writable memory cgroup; memory limits fall back to an RSS "
            "watchdog (OOM kills are simulated by SIGKILL, not by the kernel)"
        )
        return cls(None, "watchdog")

    def make(self, container_id: str, limit_bytes: int) -> Path | None:
        """Create the container's cgroup with its limit; None means use the watchdog."""
        if self.base is None:
            return None
        group = self.base / container_id
        try:
            group.mkdir(exist_ok=True)
            if self.mode == "cgroup-v1":
                (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
                # Without a memsw limit the kernel swaps instead of OOM-killing.
                with contextlib.suppress(OSError):
                    (group / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            else:
                (group / "memory.max").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):
                    (group / "memory.swap.max").write_text("0")
        except OSError as exc:
            log.warning("kubesim: cgroup %s failed (%s); using the RSS watchdog", group, exc)
            return None
        return group

    def oom_kills(self, group: Path) -> int:
        name = "memory.oom_control" if self.mode == "cgroup-v1" else "memory.events"
        try:
            text = (group / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def close(self) -> None:
        """Remove every cgroup this control created (after their processes are gone)."""
        if self.base is None:
            return
        for child in self.base.iterdir() if self.base.exists() else ():
            if child.is_dir():
                with contextlib.suppress(OSError):
                    child.rmdir()
        with contextlib.suppress(OSError):
            self.base.rmdir()


def _candidate_parents() -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if "memory" in controllers.split(","):
            found.append(("cgroup-v1", _CGROUP_FS / "memory" / rel))
        elif controllers == "":
            root = _CGROUP_FS if (_CGROUP_FS / "cgroup.controllers").exists() else None
            if root is not None and "memory" in (root / "cgroup.controllers").read_text():
                found.append(("cgroup-v2", root / rel))
    return found


def _sweep_stale(parent: Path) -> None:
    """Remove kubesim cgroups left by a killed run (their owner pid is gone)."""
    for child in parent.glob("kubesim-*"):
        pid = child.name.removeprefix("kubesim-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for grandchild in child.iterdir():
                if grandchild.is_dir():
                    with contextlib.suppress(OSError):
                        grandchild.rmdir()
            with contextlib.suppress(OSError):
                child.rmdir()


class Container:
    """One running container instance (a process group)."""

    def __init__(self, launch: Launch, proc: asyncio.subprocess.Process,
                 memory: MemoryControl, group: Path | None, log_file: IO[bytes]) -> None:
        self.launch = launch
        self.proc = proc
        self.pid = proc.pid
        self.started_at = datetime.now(UTC)
        self._memory = memory
        self._group = group
        self._log_file = log_file
        self._forced_oom = False
        self._exit: Exit | None = None
        self._pumps = [
            asyncio.ensure_future(self._pump(proc.stdout, b"stdout")),
            asyncio.ensure_future(self._pump(proc.stderr, b"stderr")),
        ]
        self._watchdog: asyncio.Future[None] | None = None
        if group is None and launch.memory_limit_bytes is not None:
            self._watchdog = asyncio.ensure_future(self._watch_rss(launch.memory_limit_bytes))

    @classmethod
    async def start(cls, launch: Launch, memory: MemoryControl, container_id: str) -> Container:
        """Spawn the instance; raises OSError when the command cannot be started."""
        group = None
        if launch.memory_limit_bytes is not None:
            group = memory.make(container_id, launch.memory_limit_bytes)
        procs = str(group / "cgroup.procs") if group is not None else ""
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(launch.log_path, "ab")  # noqa: SIM115 - closed when the instance ends
        prefix: tuple[str, ...] = ()
        if launch.mounts or launch.workdir:
            prefix = mounts.UNSHARE
            mounts.claim(launch.mounts)
        pairs = [word for pair in launch.mounts for word in pair]
        try:
            proc = await asyncio.create_subprocess_exec(
                *prefix, "/bin/sh", "-c", _WRAPPER, "kubesim", procs, launch.workdir,
                str(len(launch.mounts)), *pairs, *launch.argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=str(launch.cwd), env=dict(launch.env),
                start_new_session=True,
            )
        except OSError:
            log_file.close()
            raise
        return cls(launch, proc, memory, group, log_file)

    async def _pump(self, stream: asyncio.StreamReader | None, name: bytes) -> None:
        if stream is None:
            return
        pending = b""
        while chunk := await stream.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._write_line(name, line)
            # A line that does not end yet is written as it comes, in partial records, as
            # containerd does: its followers see a progress bar without waiting for a newline.
            while len(pending) >= MAX_LOG_LINE_BYTES:
                self._write(name, pending[:MAX_LOG_LINE_BYTES], partial=True)
                pending = pending[MAX_LOG_LINE_BYTES:]
        if pending:
            self._write(name, pending)

    def _write_line(self, stream: bytes, line: bytes) -> None:
        while len(line) > MAX_LOG_LINE_BYTES:
            self._write(stream, line[:MAX_LOG_LINE_BYTES], partial=True)
            line = line[MAX_LOG_LINE_BYTES:]
        self._write(stream, line)

    def _write(self, stream: bytes, line: bytes, partial: bool = False) -> None:
        stamp = rfc3339nano().encode()
        self._log_file.write(stamp + b" " + stream + (b" P " if partial else b" F ") + line + b"\n")
        self._log_file.flush()

    async def _watch_rss(self, limit_bytes: int) -> None:
        log.warning("kubesim: container %s memory limit enforced by RSS watchdog", self.launch.name)
        while self.proc.returncode is None:
            if group_rss_bytes(self.pid) > limit_bytes:
                self.oom_kill()
                return
            await asyncio.sleep(_WATCHDOG_PERIOD_SECONDS)

    def signal(self, sig: int) -> None:
        """Send a signal to the whole process group (ignores an already-gone group).

        Once the container has ended (`wait` killed its group), its pid may name some later,
        unrelated process group: nothing is sent then.
        """
        if self._exit is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def signal_init(self, sig: int) -> None:
        """Send a signal to the container's init process only (nothing once the container ended)."""
        if self._exit is not None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, sig)

    def oom_kill(self) -> None:
        """Kill the instance as the OOM killer would and report it as OOMKilled."""
        self._forced_oom = True
        self.signal(signal.SIGKILL)

    async def wait(self) -> Exit:
        """Wait for the instance to end; every process of its group is gone afterwards."""
        if self._exit is not None:
            return self._exit
        code = await self._init_exit(None)
        assert code is not None
        # The container's init died: like a PID namespace, take the rest with it, also what
        # left the process group (a setsid'd child, such as Prefect's flow engine).
        self.signal(signal.SIGKILL)
        kill_strays(str(self.launch.log_path.parent))
        await self.proc.wait()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._log_file.close()
        oom = self._forced_oom
        if self._group is not None:
            oom = oom or self._memory.oom_kills(self._group) > 0
            await _remove_cgroup(self._group)
        sig = -code if code < 0 else None
        exit_code = 128 + sig if sig is not None else code
        self._exit = Exit(exit_code, sig, oom, self.started_at, datetime.now(UTC))
        return self._exit

    async def stop(self, grace_seconds: float) -> Exit:
        """SIGTERM the container's init process, wait up to the grace period, then SIGKILL them all.

        As containerd's StopContainer: the stop signal goes to the container's PID 1 alone (runc
        kills the init process, not the namespace), which passes it on as it sees fit; only the
        SIGKILL at the end of the grace reaches every process of the container.
        """
        if self.proc.returncode is None and grace_seconds <= 0:
            self.signal(signal.SIGKILL)  # as containerd's StopContainer with timeout 0
        elif self.proc.returncode is None:
            self.signal_init(signal.SIGTERM)
            if await self._init_exit(grace_seconds) is None:
                self.signal(signal.SIGKILL)
        return await self.wait()

    async def _init_exit(self, timeout: float | None) -> int | None:
        """The init process's exit status once it exited, or None after `timeout` seconds.

        asyncio's wait() also waits for the output pipes to close, which a descendant that
        outlives init holds open; the container ends with its init all the same.
        """
        waiter = asyncio.ensure_future(self.proc.wait())
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.proc.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            await asyncio.wait({waiter}, timeout=_INIT_POLL_SECONDS if left is None
                               else min(left, _INIT_POLL_SECONDS))
        if not waiter.done():
            waiter.cancel()
        return self.proc.returncode


async def _remove_cgroup(group: Path) -> None:
    # rmdir fails with EBUSY until the kernel has reaped every task of the group.
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            await asyncio.sleep(0.02)
    log.warning("kubesim: could not remove cgroup %s", group)


def group_rss_bytes(pgid: int) -> int:
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total


def kill_strays(container_dir: str) -> list[int]:
    """SIGKILL every process that still carries this container's mounts in its environment.

    Every container process inherits KUBESIM_MOUNTS, which names files in the container's own
    folder; a descendant that started a session of its own escapes the process-group kill, but
    not this. Returns the pids signalled.
    """
    marker = (container_dir.rstrip("/") + "/").encode()
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        mounts = next((v for v in environ.split(b"\0") if v.startswith(b"KUBESIM_MOUNTS=")), b"")
        if marker in mounts:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed
