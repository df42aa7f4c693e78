"""Snapshots taken around the command: environment (redacted), host facts, GPU state.

Every capture that cannot be made is recorded as absent with the reason, never raised: a missing
``nvidia-smi`` or a hung driver must not keep the command from running or change its exit status.
Core-dump settings live in ``coredumps``; the crash report in ``report``.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard_entrypoint import REPORT_FORMAT
from trainguard_entrypoint.files import utc_now_iso, write_bytes_atomic, write_json_atomic
from trainguard_entrypoint.paths import INDEX
from trainguard_entrypoint.redact import redact_environment
from trainguard_entrypoint.safefiles import safe_name

DRIVER_VERSION_PATH = Path("/proc/driver/nvidia/version")
CORE_PATTERN_PATH = Path("/proc/sys/kernel/core_pattern")

# (file name in the snapshot folder, command); the commands a person debugging a GPU node runs first.
GPU_COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nvidia-smi-q.txt", ("nvidia-smi", "-q")),
    ("nvidia-smi-topo-m.txt", ("nvidia-smi", "topo", "-m")),
)


@dataclass(frozen=True)
class Capture:
    """The outcome of one capture: the file written, or why there is none."""

    name: str
    source: str
    file: str | None
    reason: str | None


def snapshot_environment(dest: Path, environ: Mapping[str, str]) -> list[str]:
    """Write ``dest`` (``env.json``) with secret-looking values redacted; return the redacted names."""
    variables, redacted = redact_environment(environ)
    write_json_atomic(
        dest,
        {"format": REPORT_FORMAT, "captured_at": utc_now_iso(), "variables": variables, "redacted": redacted},
    )
    return redacted


def _fact(compute: Any) -> Any:
    try:
        return compute()
    except Exception as exc:  # a fact we cannot read is recorded, not raised
        return {"absent": f"{type(exc).__name__}: {exc}"}


def host_facts() -> dict[str, Any]:
    """Facts about the host and this process that explain crashes (core limits, where cores go)."""
    return {
        "hostname": _fact(socket.gethostname),
        "python_version": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": _fact(platform.platform),
        "cwd": _fact(os.getcwd),
        "uid": _fact(os.getuid),
        "gid": _fact(os.getgid),
        "pid": os.getpid(),
        "cpu_count": os.cpu_count(),
        "rlimit_core": _fact(lambda: _rlimit_text(resource.getrlimit(resource.RLIMIT_CORE))),
        "core_pattern": _fact(lambda: CORE_PATTERN_PATH.read_text().strip()),
    }


def _rlimit_text(limits: tuple[int, int]) -> dict[str, int | str]:
    def one(value: int) -> int | str:
        return "unlimited" if value == resource.RLIM_INFINITY else value

    return {"soft": one(limits[0]), "hard": one(limits[1])}


def _run_capture(
    name: str, argv: Sequence[str], dest: Path, environ: Mapping[str, str], timeout_seconds: float
) -> Capture:
    source = " ".join(argv)
    executable = shutil.which(argv[0], path=environ.get("PATH", os.defpath))
    if executable is None:
        return Capture(name, source, None, f"{argv[0]} not found on PATH")
    try:
        proc = subprocess.Popen(
            [executable, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, env=dict(environ),
        )
    except OSError as exc:
        return Capture(name, source, None, f"could not run {source}: {exc.strerror or exc}")
    try:
        out, err = proc.communicate(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:  # a driver stuck in the kernel can leave the process unkillable: don't wait for it
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        return Capture(name, source, None, f"{source} timed out after {timeout_seconds:g}s")
    if proc.returncode != 0:
        detail = err.decode("utf-8", errors="replace").strip()[:500] or "no stderr"
        return Capture(name, source, None, f"{source} exited with code {proc.returncode}: {detail}")
    write_bytes_atomic(dest / name, out)
    return Capture(name, source, name, None)


def _copy_capture(name: str, path: Path, dest: Path) -> Capture:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Capture(name, str(path), None, f"no such file: {path}")
    except OSError as exc:
        return Capture(name, str(path), None, f"cannot read {path}: {exc.strerror or exc}")
    write_bytes_atomic(dest / name, data)
    return Capture(name, str(path), name, None)


def snapshot_gpu(
    dest: Path,
    environ: Mapping[str, str],
    *,
    timeout_seconds: float = 20.0,
    driver_version_path: Path = DRIVER_VERSION_PATH,
) -> list[Capture]:
    """Capture ``nvidia-smi -q``, ``nvidia-smi topo -m`` and the driver version into ``dest``.

    Writes ``dest/index.json`` listing what was captured and what is absent and why.

    Args:
        dest: The snapshot folder, e.g. ``snapshot/gpu-before``.
        environ: The environment whose ``PATH`` finds ``nvidia-smi``.
        timeout_seconds: How long one command may take; a wedged driver hangs ``nvidia-smi``.
        driver_version_path: The kernel driver's version file.
    """
    _own_folder(dest)
    captures: list[Capture] = []
    for name, argv in GPU_COMMANDS:
        try:
            captures.append(_run_capture(name, argv, dest, environ, timeout_seconds))
        except Exception as exc:
            captures.append(Capture(name, " ".join(argv), None, f"{type(exc).__name__}: {exc}"))
    try:
        captures.append(_copy_capture("driver-version.txt", driver_version_path, dest))
    except Exception as exc:
        captures.append(Capture("driver-version.txt", str(driver_version_path), None, f"{type(exc).__name__}: {exc}"))
    write_json_atomic(dest / INDEX, gpu_index(captures))
    return captures


def _own_folder(dest: Path) -> None:
    """Make ``dest``; refuse it when it, or the folder it is in, is a link the command left there.

    The second GPU snapshot is written after the command ran, and writes through its link would
    land wherever it points.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for folder in (dest.parent, dest):
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise OSError(f"{safe_name(str(folder))} is not a folder of its own (the command left a link there); "
                          "not written")


def gpu_index(captures: Sequence[Capture]) -> dict[str, Any]:
    """The ``index.json`` payload for a GPU snapshot folder."""
    return {
        "format": REPORT_FORMAT,
        "captured_at": utc_now_iso(),
        "captured": [{"name": c.name, "source": c.source, "file": c.file} for c in captures if c.file],
        "absent": [{"name": c.name, "source": c.source, "reason": c.reason} for c in captures if not c.file],
    }
