"""Pod networking on one host: a pod IP per pod in 127.0.0.0/8, and the resolver library that
lets a container's processes look names up in a hosts file of kubesim's.

What belongs here: the pool of pod IPs (every address of 127/8 is loopback on Linux, so a
container process can bind its pod IP and reach every other pod's), the block of it this
server claims (so two kubesim servers on one machine never hand out the same address), and
finding Debian's `libnss-wrapper` (LD_PRELOAD=libnss_wrapper.so with NSS_WRAPPER_HOSTS and
NSS_WRAPPER_HOSTNAME replaces the host's name resolution for one process tree, without root).

What does not: which names exist (dns.py) or starting processes (runtime.py).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kubesim.mounts import other_server_alive

log = logging.getLogger("kubesim.network")

REGISTRY = Path("/tmp/kubesim-pod-ips")
_LIBRARY_GLOBS = ("/usr/lib/*-linux-gnu/libnss_wrapper.so", "/usr/lib/libnss_wrapper.so",
                  "/usr/lib64/libnss_wrapper.so", "/usr/local/lib/libnss_wrapper.so")
_BLOCK_SIZE = 254 * 256  # 127.B.x.y with x in 0..255 and y in 1..254


def nss_wrapper() -> str | None:
    """The path of libnss_wrapper.so (Debian's libnss-wrapper), or None when not installed."""
    for pattern in _LIBRARY_GLOBS:
        for found in sorted(glob.glob(pattern)):
            return found
    return None


def claim_block() -> int:
    """The second octet of the 127.B.0.0/16 block this server hands pod IPs from.

    Claimed through a file per block holding the owner's pid; a block whose owner died is taken
    over. 127.0.0.0/16 is left to the host (127.0.0.1 is where the API listens).
    """
    REGISTRY.mkdir(parents=True, exist_ok=True)
    start = os.getpid() % 254
    for step in range(254):
        block = (start + step) % 254 + 1
        path = REGISTRY / str(block)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            with contextlib.suppress(OSError, ValueError):
                if not other_server_alive(int(path.read_text() or "0")):
                    path.write_text(str(os.getpid()))
                    return block
            continue
        with os.fdopen(fd, "w") as out:
            out.write(str(os.getpid()))
        return block
    log.warning("kubesim: every pod IP block is claimed by a live server; sharing 127.254/16")
    return 254


def release_block(block: int) -> None:
    path = REGISTRY / str(block)
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text() or "0") == os.getpid():
            path.unlink()


class PodIps:
    """Hands out pod IPs of this server's block, never one a live pod holds."""

    def __init__(self, block: int | None = None) -> None:
        self.block = claim_block() if block is None else block
        self._next = 0  # 127.B.0.2 first: 127.B.0.1 is left alone, like a gateway

    def allocate(self, pods: Iterable[dict[str, Any]]) -> str:
        """A fresh address; `pods` are the stored pods, whose live IPs are skipped."""
        taken = {(p.get("status") or {}).get("podIP") for p in pods
                 if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        for _ in range(_BLOCK_SIZE):
            self._next = self._next % _BLOCK_SIZE + 1
            address = f"127.{self.block}.{self._next // 254}.{self._next % 254 + 1}"
            if address not in taken:
                return address
        raise RuntimeError(f"kubesim: no free pod IP left in 127.{self.block}.0.0/16")

    def close(self) -> None:
        release_block(self.block)
