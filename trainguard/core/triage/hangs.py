"""A hung attempt's culprit from its ranks' stacks, taken while they were alive: the odd ones out.

When a distributed job hangs, every rank but the culprit waits in a collective (an all-reduce, a
barrier, DDP's reducer finishing a backward pass), and every rank's log ends in the same timeout.
The stacks tell them apart: the ranks that are somewhere else (a data loader, a sleep, a lock, a
different collective) are the odd ones out. This module parses stacks as `py-spy dump` (with or
without ``--native``) and Python's `faulthandler` print them, normalises their frames as the
triage fingerprint does (no line numbers, no installation prefixes), and compares the ranks'
main threads. Taking the stacks is the entrypoint's business; naming the failure from the verdict,
`trainguard.core.judging`'s; showing them, the report's.

The verdict is one of:
- ``hang``: most ranks wait in a collective and the others do not; those others are the culprits,
  with the frame where their stack leaves the waiting ranks' (``meet (train.py)``).
- ``desync``: the ranks wait in different collectives (one in a barrier, the others in an
  all-reduce): the minority is named, and the kind says a person must read both.
- ``undetermined``: every rank is in the same place (the culprit is elsewhere: another node whose
  stacks are missing, the network), or too few stacks were had to compare.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

# Frames that mean "this rank waits for its peers" (Python and native names, as py-spy prints them).
_COLLECTIVE = re.compile(
    r"(?:^|[.:_ ])(?:all_?reduce|all_?gather\w*|reduce_?scatter\w*|broadcast\w*|barrier|monitored_barrier|"
    r"all_to_all\w*|irecv|isend|batch_isend_irecv|_wait_for_pending_works|"
    r"finalize_backward|_engine_run_backward|ProcessGroup\w*|c10d::\w+|gloo::\w+|nccl\w*)\b",
    re.IGNORECASE,
)
# Frames of a rank tearing its process group down (a destructor, a transport's shutdown joining its
# threads, `destroy_process_group`): named like a collective's, they mean the rank has left the wait.
_TEARDOWN = re.compile(r"~(?:ProcessGroup|Backend|Device|Context|Loop|Pair)\w*|::release_resources\b|::shutdown\b|"
                       r"destroy_process_group", re.IGNORECASE)
# Code that only runs to talk to the other ranks: c10d, and DDP's forward and backward hooks.
_COMMUNICATING = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d", "torch/nn/parallel/distributed.py",
                  "deepspeed/comm/", "torch/distributed/fsdp/")
_INNERMOST = 12  # frames of a thread's innermost end read for a wait: the outer ones are the launcher's
_PY_SPY_THREAD = re.compile(r'^Thread (?:0x)?([0-9a-fA-F]+) \((\w+)\)(?:: "(.*)")?\s*$')
_PY_SPY_FRAME = re.compile(r"^\s+(.+?) \((.+?)(?::(\d+))?\)\s*$")
_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*?)\])? \(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'^\s+File "(.+?)", line (\d+) in (.+?)\s*$')
_PREFIX = re.compile(r"^.*?/(?:site-packages|dist-packages|lib/python3\.\d+)/")


@dataclass(frozen=True)
class Frame:
    """One frame: its function and where it is, normalised (a path below site-packages, no line)."""

    function: str
    location: str
    line: int | None = None

    @property
    def key(self) -> str:
        """The frame as compared across ranks: ``function (location)``, no line number."""
        return f"{self.function} ({self.location})"

    @property
    def collective(self) -> bool:
        """Whether the frame is a rank waiting for its peers."""
        return bool(_COLLECTIVE.search(self.function)) or any(part in self.location for part in _COMMUNICATING)


@dataclass(frozen=True)
class ThreadStack:
    """One thread's stack, innermost frame first."""

    name: str
    frames: tuple[Frame, ...]
    idle: bool | None = None

    @property
    def main(self) -> bool:
        return self.name == "MainThread" or (bool(self.frames) and self.frames[-1].function == "<module>")


@dataclass(frozen=True)
class RankStacks:
    """What was had of one rank: its threads, or why nothing (``absent``)."""

    rank: int
    threads: tuple[ThreadStack, ...] = ()
    node: str | None = None
    pid: int | None = None
    source: str = ""  # "py-spy", "py-spy --native", "faulthandler"
    absent: str | None = None  # why no stack could be had (no permission, the process ended, ...)

    @property
    def main(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), self.threads[0] if self.threads else None)


@dataclass(frozen=True)
class RankRow:
    """A rank as the report's table shows it."""

    rank: int
    node: str | None
    state: str  # "waits in a collective", "elsewhere", "no stack"
    top: tuple[str, ...]  # the innermost frames worth reading
    differs: str = ""  # the frame where it leaves the waiting ranks' stack, for an odd one out


@dataclass(frozen=True)
class HangVerdict:
    """Which ranks the hang is on, and the evidence a person checks it by."""

    kind: str  # "hang", "desync", "undetermined"
    culprits: tuple[int, ...]
    frame: str  # the frame that sets the culprits apart ("" when none)
    reason: str
    rows: tuple[RankRow, ...] = field(default_factory=tuple)


def normalise(location: str) -> str:
    """A frame's file as py-spy spells it, whoever printed it: below site-packages (``torch/nn/...``),
    else its file name for an absolute path (the training script); a relative path stays."""
    trimmed = _PREFIX.sub("", location)
    if trimmed != location:
        return trimmed
    return location.rsplit("/", 1)[-1] if location.startswith("/") else location


def parse_py_spy(text: str) -> tuple[ThreadStack, ...]:
    """The threads of one `py-spy dump` (Python frames; native ones too with ``--native``)."""
    threads: list[ThreadStack] = []
    name, idle, frames = "", None, []  # type: tuple[str, bool | None, list[Frame]]
    started = False
    for line in text.splitlines():
        if match := _PY_SPY_THREAD.match(line):
            if started:
                threads.append(ThreadStack(name, tuple(frames), idle))
            name, idle, frames, started = match.group(3) or match.group(1), match.group(2) == "idle", [], True
        elif started and (match := _PY_SPY_FRAME.match(line)):
            number = int(match.group(3)) if match.group(3) else None
            frames.append(Frame(match.group(1), normalise(match.group(2)), number))
        elif started and line.startswith("    ") and (native := line.strip()):
            frames.append(Frame(native.split(" (")[0], native.rpartition("(")[2].rstrip(")") if "(" in native else ""))
    if started:
        threads.append(ThreadStack(name, tuple(frames), idle))
    return tuple(threads)


def parse_faulthandler(text: str) -> tuple[ThreadStack, ...]:
    """The threads of one `faulthandler.dump_traceback(all_threads=True)` (most recent call first)."""
    threads: list[ThreadStack] = []
    name, frames, started = "", [], False  # type: tuple[str, list[Frame], bool]
    for line in text.splitlines():
        if match := _FH_THREAD.match(line):
            if started:
                threads.append(ThreadStack(name, tuple(frames)))
            name, frames, started = match.group(3) or match.group(2), [], True
        elif started and (match := _FH_FRAME.match(line)):
            frames.append(Frame(match.group(3), normalise(match.group(1)), int(match.group(2))))
    if started:
        threads.append(ThreadStack(name, tuple(frames)))
    return tuple(threads)


_NATIVE = re.compile(r"\.so(?:\.\d+)*$|^$")


def _where(stack: ThreadStack) -> str:
    """Where a thread is, as compared: its innermost Python frame (native ones, from ``--native``,
    are passed over: the same Python frame sits in different C++ frames from one poll to the next)."""
    for frame in stack.frames:
        if not _NATIVE.search(frame.location) and not frame.function.startswith("0x"):
            return frame.key
    return stack.frames[0].key if stack.frames else ""


def _waits(stack: ThreadStack) -> bool:
    innermost = stack.frames[:_INNERMOST]
    return not any(_TEARDOWN.search(f.function) for f in innermost) and any(f.collective for f in innermost)


def _python(frames: tuple[Frame, ...]) -> list[Frame]:
    """A stack's Python frames (all of them when it has none): a native frame with no symbol is an
    address, which differs in every process (ASLR), and the C++ frames around the same Python frame
    differ from one poll to the next."""
    kept = [f for f in frames if not _NATIVE.search(f.location) and not f.function.startswith("0x")]
    return kept or list(frames)


def _parting(odd: ThreadStack, waiting: ThreadStack) -> str:
    """The frame where ``odd`` leaves ``waiting``'s stack: the first Python frame, from the outermost,
    they do not share."""
    outer_odd, outer_waiting = _python(odd.frames)[::-1], _python(waiting.frames)[::-1]
    for index, frame in enumerate(outer_odd):
        if index >= len(outer_waiting) or outer_waiting[index].key != frame.key:
            line = f":{frame.line}" if frame.line is not None else ""
            return f"{frame.function} ({frame.location}{line})"
    return _where(odd)


def odd_ones_out(ranks: Sequence[RankStacks]) -> HangVerdict:
    """Compare the ranks' main threads and name the ones a hang is on (see the module docstring)."""
    had = [(r, r.main) for r in ranks if r.main is not None and r.main.frames]
    places = Counter(_where(main) for _, main in had)
    waiting = {place for place in places if any(_waits(m) for _, m in had if _where(m) == place)}
    rows: list[RankRow] = []
    culprits: list[int] = []
    frame = ""
    reference = next((m for _, m in had if _where(m) in waiting), None)
    majority = places.most_common(1)[0][0] if places else ""
    for rank in ranks:
        main = rank.main
        if main is None or not main.frames:
            rows.append(RankRow(rank.rank, rank.node, "no stack", (), rank.absent or "no stack"))
            continue
        place = _where(main)
        top = tuple(f.key for f in main.frames[:3])
        if place in waiting and (len(waiting) == 1 or place == majority):
            rows.append(RankRow(rank.rank, rank.node, "waits in a collective", top))
            continue
        differs = _parting(main, reference) if reference is not None else place
        culprits.append(rank.rank)
        frame = frame or differs
        state = "waits in another collective" if place in waiting else "elsewhere"
        rows.append(RankRow(rank.rank, rank.node, state, top, differs))
    return _verdict(ranks, had, waiting, culprits, frame, tuple(rows))


def _verdict(ranks: Sequence[RankStacks], had: list[tuple[RankStacks, ThreadStack]], waiting: set[str],
             culprits: list[int], frame: str, rows: tuple[RankRow, ...]) -> HangVerdict:
    if len(had) < 2:
        return HangVerdict("undetermined", (), "", f"stacks of {len(had)} of {len(ranks)} ranks: too few to compare",
                           rows)
    if not culprits:
        where = _where(had[0][1])
        return HangVerdict("undetermined", (), "", f"every rank with a stack is in the same place ({where}): the "
                           "culprit is not among them (a rank without a stack, another node, the network)", rows)
    if not waiting:
        return HangVerdict("undetermined", (), "", "no rank waits in a collective: the stacks do not show a hang "
                           "between ranks", rows)
    if len(culprits) * 2 > len(had):
        return HangVerdict("undetermined", (), "", "most ranks are somewhere else than a collective: no odd one "
                           "out stands apart", rows)
    kind = "desync" if len(waiting) > 1 and all(r.state != "elsewhere" for r in rows if r.rank in culprits) else "hang"
    names = ", ".join(str(rank) for rank in culprits)
    if kind == "desync":
        reason = f"rank(s) {names} wait in a different collective than the others: the ranks are out of step"
    else:
        reason = f"rank(s) {names} are not in the collective the others wait in: they are at {frame}"
    return HangVerdict(kind, tuple(culprits), frame, reason, rows)
