"""The ranks' stacks the entrypoint took in one node's attempt folder, as triage reads them.

The entrypoint writes `stacks/index.json` (what each rank's file is, or why it is absent) and one
file per rank. They lie in the job's folder, so they are read as the job's files are: regular
files only, never through a link, at most `MAX_STACK_BYTES` each.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from trainguard.core.triage import hangs

STACKS, INDEX = "stacks", "index.json"
MAX_STACK_BYTES = 4 * 1024 * 1024
MAX_RANKS = 4096


def read_stacks(folder: Path, node: str | None = None) -> tuple[hangs.RankStacks, ...]:
    """Every rank's stack recorded in one node's attempt folder; () when none was taken."""
    index = _read(folder / STACKS / INDEX)
    try:
        ranks = json.loads(index)["ranks"] if index else {}
    except (ValueError, KeyError, TypeError):
        return ()
    found = []
    for rank, entry in list(ranks.items())[:MAX_RANKS] if isinstance(ranks, dict) else []:
        if not str(rank).isdigit() or not isinstance(entry, dict):
            continue
        source, name = str(entry.get("source") or ""), entry.get("file")
        text = _read(folder / STACKS / name) if isinstance(name, str) and "/" not in name else None
        if text is None:
            found.append(hangs.RankStacks(int(rank), node=node, source=source,
                                          absent=str(entry.get("absent") or "no stack file")))
            continue
        decoded = text.decode("utf-8", "replace")
        threads = hangs.parse_faulthandler(decoded) if source == "faulthandler" else hangs.parse_py_spy(decoded)
        pid = entry.get("pid")
        found.append(hangs.RankStacks(int(rank), threads, node=node, pid=pid if isinstance(pid, int) else None,
                                      source=source))
    return tuple(found)


def _read(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_STACK_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= MAX_STACK_BYTES else None
