"""Reading one log line the way a person would: without colour codes, runtime prefixes and ranks.

Container runtimes (CRI), launchers (torchrun's ``[rankN]:``, mpirun's ``[1,0]<stderr>:``) and
loggers wrap every line in prefixes that say *where* a line came from, not *what* it says. Rules
match the bare message; the rank and the timestamp are kept aside because the root-cause choice
needs them. Everything here works on one already-split line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_SIGNATURE_CHARS = 300

# CSI (colours), OSC (window titles, hyperlinks: their text is no log text) and two-byte escapes.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
# CRI log format: RFC3339Nano timestamp, stream, partial/full tag.
_CRI = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (?:stdout|stderr) [FP] ")
# One prefix layer at a time; they stack in any order ("[80746] [rank0]:[E321 ...]").
# torchrun's ``--tee`` prefix ``[default<local rank>]:`` names a rank on its node only: it is kept
# apart and used only when no global ``[rankN]:`` names the line.
_LOCAL = re.compile(r"^\[default(\d+)\]:")
_PREFIXES = (
    re.compile(r"^\[(?:rank|Rank|RANK) ?(\d+)\]:? ?"),
    _LOCAL,
    re.compile(r"^\[(?:\d+),(\d+)\]<(?:stdout|stderr)>: ?"),
    re.compile(r"^(\d+): (?=\S)"),  # srun --label
    re.compile(r"^\[\d+\] (?=\[)"),  # a pid in brackets before another prefix
    # Ray prefixes every worker's output with its actor and pid: "(RayTrainWorker pid=41, ip=...)".
    re.compile(r"^\((?:[\w.-]+ )?pid=\d+(?:, [\w-]+=[^,)\s]+)*\) ?|^\(raylet\) ?"),
    # SkyPilot names each node's output "(head, rank=0, pid=4773)" or "(node-0, worker1, rank=1, pid=..., ip=...)":
    # its rank is the node's, not a process's, so it names no rank here.
    re.compile(r"^\((?:[\w.-]+, )?(?:head|worker\d+), rank=\d+, pid=\d+(?:, ?[\w-]+=[^,)\s]+)*\) ?"),
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?: ?"),
    # Determined-style "[2022-05-31T14:29:44.164Z] dc5b74e6 [rank=0] || ".
    re.compile(r"^\[\d{4}-\d\d-\d\dT[\d:.]+Z?\] (?:\w+ )?(?:\[rank=(\d+)\] )?\|\| ?"),
)
# A traceback quotes the code that raised ("raise SSLError(e, request=request)", "except
# OSError:"), and rich tracebacks box their source excerpts between "│" rails: such a line names
# an exception class or a message without it having happened.
SOURCE = re.compile(r"^(?:raise\s+[\w.]+|except\b[\w.\s,()]*(?:\bas\s+\w+)?:?$)|^│.*│$")
_RANK_IN_TEXT = re.compile(r"\[(?:Rank|rank) ?(\d+)\]|\brank[:= ]\s*(\d+)\b|\blocal_rank: (\d+)")
_ISO_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?")
# glog and c10 stamps: "E0626 06:24:44.903881" or torch's unpadded "[E626 06:24:44.903881913".
_GLOG_TIME = re.compile(r"(?:^|\[)[IWEF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?")
# A source location that leads a message ("[/pytorch/third_party/gloo/.../pair.cc:553] ") or a
# glog stamp ("E1202 06:49:01.931000 12191 torch/.../api.py:1002] "): where, not what happened.
_WHERE = re.compile(r"(?:^|(?<=: ))\[[^\]\s]+\.(?:cc|cpp|cu|h|hpp|c):\d+\] ?"
                    r"|^\[?[IWEF]\d{3,4} [\d:.]+ (?:\d+ )?[\w/.-]+:\d+\] ?")


@dataclass(frozen=True)
class Line:
    """One log line, read."""

    text: str
    rank: int | None
    timestamp: tuple[int, int, float] | None


def decode(raw: bytes) -> str:
    """Decode a raw line whatever its encoding; undecodable bytes become U+FFFD."""
    return raw.decode("utf-8", "replace").rstrip("\r\n")


def read_line(raw: bytes | str) -> Line:
    """Strip ANSI codes and launcher prefixes from one line; keep its rank and timestamp."""
    text = decode(raw) if isinstance(raw, bytes) else raw.rstrip("\r\n")
    text = _ANSI.sub("", text).replace("\r", "")
    stamp = None
    cri = _CRI.match(text)
    if cri:
        stamp = _timestamp(cri.group(1))
        text = text[cri.end():]
    rank = local = None
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            m = prefix.match(text)
            if m:
                if m.groups() and m.group(1) is not None:
                    if prefix is _LOCAL:
                        local = int(m.group(1)) if local is None else local
                    elif rank is None:
                        rank = int(m.group(1))
                text = text[m.end():]
                changed = True
    if rank is None:
        m = _RANK_IN_TEXT.search(text)
        if m:
            rank = int(next(g for g in m.groups() if g is not None))
    if rank is None:
        rank = local
    return Line(text.strip(), rank, stamp or _timestamp(text))


def _timestamp(text: str) -> tuple[int, int, float] | None:
    """A sortable (month, day, seconds) key; years are dropped so glog and ISO stamps compare."""
    m = _ISO_TIME.search(text[:64])
    if m:
        frac = float("0." + m.group(7)) if m.group(7) else 0.0
        secs = int(m.group(4)) * 3600 + int(m.group(5)) * 60 + int(m.group(6)) + frac
        return (int(m.group(2)), int(m.group(3)), secs)
    m = _GLOG_TIME.search(text[:64])
    if m:
        frac = float("0." + m.group(6)) if m.group(6) else 0.0
        secs = int(m.group(3)) * 3600 + int(m.group(4)) * 60 + int(m.group(5)) + frac
        return (int(m.group(1)), int(m.group(2)), secs)
    return None


def trim(text: str) -> str:
    """Bound a signature's length so one pathological line cannot bloat a report."""
    text = text.strip()
    if len(text) <= MAX_SIGNATURE_CHARS:
        return text
    return text[: MAX_SIGNATURE_CHARS - 1] + "…"


def signature_of(text: str) -> str:
    """The words of an evidence line that say what happened, without where in the source."""
    return trim(_WHERE.sub("", text, count=2))
