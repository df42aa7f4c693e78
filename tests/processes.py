"""Whether a process the tests started (or left behind) still runs: the one check every test uses."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie has ended (it only waits to be reaped), and so has a vanished pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X")
