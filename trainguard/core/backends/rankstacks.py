"""The ranks' stacks the entrypoint took in one node's attempt folder, as triage reads them.

The entrypoint writes `stacks/index.json` (what each rank's file is, or why it is absent) and one
file per rank. They lie in the job's folder, so they are read as the job's files are: regular
files linked once, reached through no link (`jobfiles.read_small`), each once, within bounds that hold whatever the job wrote:

- `MAX_STACK_BYTES` of one rank's file, and of the index;
- `MAX_STACKS_BYTES` of all the files an attempt's ranks name, every node's together (`StackBudget`):
  past it, a rank is recorded absent with the reason;
- `MAX_RANKS` ranks of one attempt, every node's together;
- a file named by two ranks is read for the first only; the other is recorded absent;
- of each rank only its main thread is kept (what the comparison reads), and of that thread the
  innermost and outermost `KEPT_FRAMES` frames; the whole files stay in the evidence;
- an index nested too deeply to parse, or with numbers too large for a float, reads as none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from trainguard.core.backends import jobfiles
from trainguard.core.backends.workspace import INDEX, STACKS
from trainguard.core.triage import hangs

MAX_STACK_BYTES = 4 * 1024 * 1024
MAX_STACKS_BYTES = 64 * 1024 * 1024
MAX_RANKS = 4096
KEPT_FRAMES = 32  # of each end of a rank's main thread


@dataclass
class StackBudget:
    """What is left to read of one attempt's stacks, shared by its nodes' folders."""

    bytes_left: int = MAX_STACKS_BYTES
    ranks_left: int = MAX_RANKS


def read_stacks(folder: Path, node: str | None = None,
                budget: StackBudget | None = None) -> tuple[hangs.RankStacks, ...]:
    """Every rank's stack recorded in one node's attempt folder; () when none was taken.

    Args:
        folder: The node's attempt folder.
        node: The node's name, for the report.
        budget: The attempt's budget, when its nodes' folders are read one after another; a fresh one otherwise.
    """
    budget = budget if budget is not None else StackBudget()
    ranks = _index(folder)
    found: list[hangs.RankStacks] = []
    named: dict[str, int] = {}
    for rank, entry in ranks.items():
        if budget.ranks_left <= 0:
            break
        if not (str(rank).isascii() and str(rank).isdigit()) or len(str(rank)) > 9 or not isinstance(entry, dict):
            continue
        budget.ranks_left -= 1
        number, source, name = int(str(rank)), str(entry.get("source") or "")[:64], entry.get("file")
        pid = entry.get("pid") if isinstance(entry.get("pid"), int) and not isinstance(entry.get("pid"), bool) else None
        absent = str(entry.get("absent") or "no stack file")[:200]
        if isinstance(name, str) and name in named:
            absent = f"its stack file {name[:80]!r} is rank {named[name]}'s"
        elif isinstance(name, str) and "/" not in name and name not in ("", ".", ".."):
            named[name] = number
            text, why = _read(folder, f"{STACKS}/{name}", budget)
            if text is not None:
                decoded = text.decode("utf-8", "replace")
                del text
                parse = hangs.parse_faulthandler if source == "faulthandler" else hangs.parse_py_spy
                found.append(hangs.RankStacks(number, _main_only(parse(decoded)), node=node, pid=pid, source=source))
                continue
            absent = why or absent
        found.append(hangs.RankStacks(number, node=node, source=source, absent=absent))
    return tuple(found)


def _index(folder: Path) -> dict[object, object]:
    data = jobfiles.read_small(folder, f"{STACKS}/{INDEX}", MAX_STACK_BYTES)
    try:
        ranks = json.loads(data)["ranks"] if data and len(data) <= MAX_STACK_BYTES else {}
    except (ValueError, KeyError, TypeError, RecursionError):
        return {}
    return ranks if isinstance(ranks, dict) else {}


def _main_only(threads: tuple[hangs.ThreadStack, ...]) -> tuple[hangs.ThreadStack, ...]:
    """The rank's main thread alone, its middle frames left out past `KEPT_FRAMES` at each end."""
    main = hangs.RankStacks(0, threads).main
    if main is None:
        return ()
    frames = main.frames
    if len(frames) > 2 * KEPT_FRAMES:
        frames = frames[:KEPT_FRAMES] + frames[-KEPT_FRAMES:]
    return (replace(main, name=main.name[:200], frames=frames),)


def _read(folder: Path, relative: str, budget: StackBudget) -> tuple[bytes | None, str | None]:
    """A rank's file within the budget, and the reason when it is not read."""
    if budget.bytes_left <= 0:
        return None, f"not read: the attempt's stacks are over {MAX_STACKS_BYTES // (1024 * 1024)} MiB"
    limit = min(MAX_STACK_BYTES, budget.bytes_left)
    data = jobfiles.read_small(folder, relative, limit)
    if data is None:
        return None, None
    if len(data) > limit:
        over = "the file's 4 MiB" if limit == MAX_STACK_BYTES else "what is left of the attempt's stacks' budget"
        return None, f"not read: over {over}"
    budget.bytes_left -= len(data)
    return data, None

