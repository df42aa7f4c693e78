"""torchelastic's error file: the failed rank's own record of its exception, as JSON.

A worker whose entrypoint is wrapped in ``torch.distributed.elastic.multiprocessing.errors.record``
writes its uncaught exception to ``$TORCHELASTIC_ERROR_FILE`` (torchrun points each worker at
``<log dir>/<run>/attempt_<n>/<local rank>/error.json``); when the run fails, the agent copies its
root-cause worker's file to the agent's own ``$TORCHELASTIC_ERROR_FILE``, adding the worker's exit
code. As torch 2.13 writes it::

    {"message": {"message": "RuntimeError: ...",
                 "extraInfo": {"py_callstack": "Traceback (most recent call last): ...",
                               "timestamp": "1796194031"},
                 "errorCode": 1}}

A worker killed by a signal writes nothing, and neither does the agent then. The JSON does not
name the rank: the caller knows it from where the file was (``local_rank_of``), or torchrun's
failure report in the log names the file. Parsing only; reading files is the caller's business.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

_LAYOUT = re.compile(r"attempt_\d+[/\\](\d+)[/\\]error\.json$")


@dataclass(frozen=True)
class ErrorFile:
    """What one torchelastic error file says.

    Attributes:
        message: The exception as one line (``RuntimeError: ...``).
        traceback: The Python call stack the worker recorded, ending in the exception.
        timestamp: When the worker recorded it, in seconds since the epoch, if given.
        exit_code: The worker's exit code, present in the agent's copy only.
        rank: The global rank that wrote it, when known.
        source: Where it was read from (a path), for the evidence line.
    """

    message: str
    traceback: str
    timestamp: float | None = None
    exit_code: int | None = None
    rank: int | None = None
    source: str | None = None

    @property
    def agent_copy(self) -> bool:
        """Whether this is the agent's copy of its root-cause worker's file."""
        return self.exit_code is not None

    @property
    def text(self) -> str:
        """The evidence as log text: the call stack, or the message when there is none."""
        stack = self.traceback.rstrip("\n")
        if not stack:
            return self.message
        last = stack.rsplit("\n", 1)[-1]
        return stack if last.strip() == self.message.strip() else f"{stack}\n{self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "timestamp": self.timestamp, "exit_code": self.exit_code,
                "rank": self.rank, "source": self.source}


def parse_error_file(data: str | bytes, *, rank: int | None = None,
                     source: str | None = None) -> ErrorFile | None:
    """Read one torchelastic error file.

    Args:
        data: The file's content.
        rank: The global rank that wrote it, if the caller knows it.
        source: Where it came from; a torchrun log-dir path also gives the local rank.

    Returns:
        The error it records, or None when it records none: empty (the worker was killed by a
        signal), not torchelastic's JSON, or nested too deeply to parse.
    """
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return None
    outer = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(outer, str):  # a plain message, as record_exception writes for a non-Python error
        return ErrorFile(outer, "", None, None, rank, source)
    if not isinstance(outer, dict):
        return None
    info = outer.get("extraInfo")
    extra: dict[str, Any] = info if isinstance(info, dict) else {}
    message = str(outer.get("message") or "")
    stack = str(extra.get("py_callstack") or "")
    if not (message or stack):
        return None
    return ErrorFile(message, stack, _number(extra.get("timestamp")),
                     _whole(outer.get("errorCode")), rank, source)


def local_rank_of(path: str) -> int | None:
    """The local rank a worker's error file belongs to, from torchrun's log-dir layout
    (``.../attempt_0/3/error.json``); None for any other path (an agent's own file)."""
    m = _LAYOUT.search(path)
    return int(m.group(1)) if m else None


def _number(value: Any) -> float | None:
    try:
        number = float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):  # a 400-digit integer is no timestamp
        return None
    return number if number is not None and math.isfinite(number) else None


def _whole(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    try:
        return int(value)
    except ValueError:
        return None
