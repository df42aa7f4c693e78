"""Core dumps: let the command dump core, then find the core file and keep it with the attempt.

Where the kernel writes a core is decided by ``/proc/sys/kernel/core_pattern``: a relative pattern
(``core``, ``core.%p``) means the crashed process's cwd, an absolute one a fixed folder, and a
pattern starting with ``|`` hands the core to a program outside our reach. This module reads that
policy, raises ``RLIMIT_CORE`` and explains, in one line, whenever no core is kept. The command
can plant files where its core would go, so only a fresh regular file is taken for a core, and it
is moved without following a link (a copy across file systems keeps its holes, through `safefiles`).

The command is often a launcher (torchrun) whose workers crash while it exits with a code: their
cores are kept too. Whose core a file is comes from the core itself (its ``NT_PRPSINFO`` note: pid
and parent pid), so only the cores of the command's own children (or of orphans the entrypoint
reaped as a subreaper) are taken, never another process's in the same folder.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import resource
import signal
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from trainguard_entrypoint import safefiles

CORE_PATTERN_PATH = Path("/proc/sys/kernel/core_pattern")
CORE_USES_PID_PATH = Path("/proc/sys/kernel/core_uses_pid")

# Signals whose default action is to terminate with a core dump (signal(7), "Core").
CORE_SIGNALS = frozenset(
    int(s) for s in (
        signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE,
        signal.SIGSEGV, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSYS,
    )
)

_SPECIFIER = re.compile(r"%(.)")
_COPY_SECONDS = 600.0  # a core copied across file systems; beyond that it stays where the kernel wrote it
_NT_PRPSINFO = 3
_NOTES_READ = 256 * 1024  # the process note comes second, after the first thread's registers
_HEADERS_READ = 64  # program headers read while looking for the note segment (it comes first)


@dataclass(frozen=True)
class CorePolicy:
    """How this process's children dump core, as far as we can tell from inside the container."""

    pattern: str | None
    uses_pid: bool
    soft_limit: int
    hard_limit: int
    disabled_reason: str | None  # why no core can be kept at all, whatever the crash

    @property
    def pipes_to_handler(self) -> bool:
        """Whether cores go to a handler program (systemd-coredump, apport) instead of a file."""
        return bool(self.pattern and self.pattern.startswith("|"))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def enable_core_dumps() -> CorePolicy:
    """Raise ``RLIMIT_CORE`` to its hard limit for this process and its children; describe the policy."""
    reason: str | None = None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
            soft = hard
    except (OSError, ValueError) as exc:
        soft = hard = 0
        reason = f"RLIMIT_CORE could not be raised ({exc}); the kernel writes no core"
    pattern = _read(CORE_PATTERN_PATH)
    uses_pid = _read(CORE_USES_PID_PATH) == "1"
    if reason is not None:
        pass
    elif hard == 0:
        reason = (
            "the RLIMIT_CORE hard limit is 0, so the kernel writes no core; "
            "allow core dumps in the container runtime (ulimit -c unlimited)"
        )
    elif pattern is None:
        reason = f"cannot read {CORE_PATTERN_PATH}, so where cores go is unknown"
    elif pattern.startswith("|"):
        reason = f"core_pattern pipes cores to a handler outside this container ({pattern}); look for the core there"
    elif pattern == "":
        reason = "core_pattern is empty, so the kernel writes no core"
    return CorePolicy(pattern, uses_pid, soft, hard, reason)


def core_glob(policy: CorePolicy, *, pid: int, cwd: Path, signal_number: int | None, any_pid: bool = False) -> str:
    """The glob that matches the core file the kernel wrote for process ``pid`` (for any process with ``any_pid``)."""
    assert policy.pattern is not None
    known = {"u": str(os.getuid()), "g": str(os.getgid()), "%": "%"}
    if not any_pid:
        known["p"] = str(pid)
    if signal_number is not None:
        known["s"] = str(signal_number)
    parts: list[str] = []
    last = 0
    for match in _SPECIFIER.finditer(policy.pattern):
        parts.append(glob.escape(policy.pattern[last : match.start()]))
        value = known.get(match.group(1))
        parts.append(glob.escape(value) if value is not None else "*")
        last = match.end()
    parts.append(glob.escape(policy.pattern[last:]))
    text = "".join(parts)
    if policy.uses_pid and "%p" not in policy.pattern:
        text += ".*" if any_pid else f".{pid}"  # core_uses_pid appends the pid when the pattern lacks %p
    base = Path(glob.escape(str(cwd)))
    return text if text.startswith("/") else str(base / text)


def _no_core_reason(policy: CorePolicy, signal_number: int | None, exit_code: int | None) -> str | None:
    if signal_number is None:
        return (
            f"the command exited with code {exit_code}; "
            "cores are only dumped when a process dies of a signal such as SIGSEGV or SIGABRT"
        )
    if signal_number not in CORE_SIGNALS:
        return f"{signal_name(signal_number)} does not produce a core dump"
    return policy.disabled_reason


def collect_core_files(
    policy: CorePolicy, *, pid: int, cwd: Path, signal_number: int | None, exit_code: int | None,
    core_dumped: bool, dest: Path, not_before: float,
) -> tuple[list[str], str | None]:
    """Move the core file(s) of process ``pid`` into ``dest``; return their names, or why there are none.

    Args:
        policy: From `enable_core_dumps`.
        pid: The crashed process.
        cwd: Its working directory, where a relative core_pattern puts the core.
        signal_number: The signal that killed it, or None if it exited.
        exit_code: Its exit code when it exited.
        core_dumped: Whether the kernel reported a core dump (``WCOREDUMP``).
        dest: The attempt's ``coredumps`` folder.
        not_before: Epoch seconds when the command started; older files are someone else's cores.
    """
    reason = _no_core_reason(policy, signal_number, exit_code)
    if reason is not None:
        return [], reason
    pattern = core_glob(policy, pid=pid, cwd=cwd, signal_number=signal_number)
    refused: list[str] = []
    found = [p for p in glob.glob(pattern) if _is_fresh_core(p, not_before, refused)]
    if not found:
        not_kept = f"; not taken for a core: {'; '.join(refused)}" if refused else ""
        if not core_dumped:
            return [], (
                f"the kernel dumped no core for {signal_name(signal_number)} (check RLIMIT_CORE, "
                f"the process's dumpable flag and core_pattern {policy.pattern!r}){not_kept}"
            )
        return [], f"the kernel reported a core dump but no file matched {pattern!r}{not_kept}"
    moved, problems = _move_into(dest, [(source, Path(source).name) for source in sorted(found)])
    return moved, ("; ".join(problems) or None) if not moved else None


def _move_into(dest: Path, cores: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Move each ``(source, name)`` core into ``dest`` under a free name; the names kept, and one line per failure."""
    if not cores:
        return [], []
    dest.mkdir(parents=True, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(dest).st_mode):
        return [], [f"{safefiles.safe_name(str(dest))} is not a folder (a link?): the core stays at {cores[0][0]}"]
    moved: list[str] = []
    problems: list[str] = []
    for source, name in cores:
        target = _free_name(dest, name)
        try:
            _move(source, target)
            moved.append(target.name)
        except OSError as exc:
            problems.append(f"cannot move {source} to {target}: {exc.strerror or exc}")
    return moved, problems


@dataclass(frozen=True)
class CoreProcess:
    """Whose core a file is, from the core's ``NT_PRPSINFO`` note."""

    pid: int
    ppid: int
    name: str


def core_process(path: str | Path) -> CoreProcess | None:
    """The process a 64-bit little-endian ELF core was dumped from; None for anything else or unreadable.

    Reads the ELF header, the program headers up to the note segment and that segment's notes,
    a few kilobytes at most whatever the core's size.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        header = os.pread(fd, 64, 0)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return None
        kind, = struct.unpack_from("<H", header, 16)
        phoff, = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        if kind != 4 or phentsize < 56:  # ET_CORE
            return None
        for index in range(min(phnum, _HEADERS_READ)):
            entry = os.pread(fd, 56, phoff + index * phentsize)
            if len(entry) < 56:
                return None
            segment, = struct.unpack_from("<I", entry, 0)
            if segment == 4:  # PT_NOTE
                offset, _, _, size = struct.unpack_from("<QQQQ", entry, 8)
                return _prpsinfo(os.pread(fd, min(size, _NOTES_READ), offset))
        return None
    except (OSError, struct.error, OverflowError):
        return None
    finally:
        os.close(fd)


def _prpsinfo(notes: bytes) -> CoreProcess | None:
    at = 0
    while at + 12 <= len(notes):
        name_size, desc_size, kind = struct.unpack_from("<III", notes, at)
        desc = at + 12 + (name_size + 3) // 4 * 4
        if kind == _NT_PRPSINFO and desc + 136 <= len(notes):
            # struct elf_prpsinfo on 64-bit Linux: pid and ppid at 24, fname[16] at 40
            pid, ppid = struct.unpack_from("<ii", notes, desc + 24)
            name = notes[desc + 40 : desc + 56].split(b"\0", 1)[0].decode("utf-8", "replace")
            return CoreProcess(pid, ppid, name)
        at = desc + (desc_size + 3) // 4 * 4
    return None


def collect_child_cores(
    policy: CorePolicy, *, parents: frozenset[int], command_pid: int, cwd: Path, dest: Path, not_before: float,
) -> tuple[list[str], list[str]]:
    """Move the fresh cores of the command's children (a launcher's workers) into ``dest``.

    Args:
        policy: From `enable_core_dumps`.
        parents: Whose children count: the command and the entrypoint (which reaps orphans).
        command_pid: The command itself, whose own core `collect_core_files` keeps.
        cwd: The command's working directory, where a relative core_pattern puts the cores.
        dest: The attempt's ``coredumps`` folder.
        not_before: Epoch seconds when the command started.

    Returns:
        The names kept (each with the process's pid and name) and one line per core that could not be moved.
    """
    if policy.pattern is None or policy.disabled_reason is not None or policy.pipes_to_handler:
        return [], []
    pattern = core_glob(policy, pid=0, cwd=cwd, signal_number=None, any_pid=True)
    cores: list[tuple[str, str]] = []
    for source in sorted(glob.glob(pattern))[:64]:
        owner = core_process(source) if _is_fresh_core(source, not_before, []) else None
        if owner is not None and owner.pid != command_pid and owner.ppid in parents:
            label = re.sub(r"[^A-Za-z0-9_.-]", "_", owner.name)[:16] or "process"
            cores.append((source, f"{Path(source).name}.{label}.{owner.pid}"))
    return _move_into(dest, cores)


def _is_fresh_core(path: str, not_before: float, refused: list[str]) -> bool:
    """A regular file, linked once, written since the command started: what the kernel writes."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    # one second of slack: some filesystems store mtime with coarse granularity
    if info.st_mtime < not_before - 1.0:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        refused.append(f"{safefiles.safe_name(path)} is not a regular file of its own")
        return False
    return True


def _move(source: str, target: Path) -> None:
    """Rename ``source`` (never following a link); across file systems, copy it keeping its holes."""
    try:
        os.rename(source, target)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    with safefiles.open_regular(source) as handle:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                copied = safefiles.copy(handle, out, keep_holes=True, timeout_seconds=_COPY_SECONDS)
            if not copied.complete:
                raise OSError(f"the copy was cut short ({copied.reason}); the core stays at {source}")
        except BaseException:
            target.unlink(missing_ok=True)
            raise
    os.unlink(source)


def _free_name(folder: Path, name: str) -> Path:
    target = folder / name
    counter = 1
    while os.path.lexists(target):
        target = folder / f"{name}.{counter}"
        counter += 1
    return target


def signal_name(number: int | None) -> str | None:
    """``SIGSEGV`` for 11, or ``signal N`` for a number Python has no name for; None for None."""
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
