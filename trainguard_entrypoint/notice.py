"""The notice file: a stop that gives warning, with an absolute deadline, for the training to act on.

`TRAINGUARD_NOTICE_FILE` names, for the training process on every backend, a path in the attempt's
(node's) folder. Whoever gives notice writes it atomically as JSON::

    {"version": 1, "reason": "<eviction|preemption|time_limit|deadline|cancelled|terminated|interrupted>",
     "given_at": <unix seconds>, "deadline": <unix seconds>, "source": "<short text>"}

and then sends SIGTERM to the training command. A training process that gets SIGTERM or SIGINT
and finds no notice file treats it as a notice whose deadline is now plus
`TRAINGUARD_NOTICE_GRACE_SECONDS` (default 25). The file lies where the training job can write,
so `read_notice` returns None for anything that is not such a notice, never raising.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainguard_entrypoint import safefiles
from trainguard_entrypoint.files import write_bytes_atomic

NOTICE_FORMAT = 1
NOTICE_FILE_ENV = "TRAINGUARD_NOTICE_FILE"
NOTICE_GRACE_ENV = "TRAINGUARD_NOTICE_GRACE_SECONDS"
DEFAULT_GRACE_SECONDS = 25.0
NOTICE_FILE = "notice.json"
REASONS = ("eviction", "preemption", "time_limit", "deadline", "cancelled", "terminated", "interrupted")
_LIMIT_BYTES = 64 * 1024
_SOURCE_CHARS = 200


@dataclass(frozen=True)
class Notice:
    """A stop with warning: why, when it was given and by when the training must be done."""

    reason: str
    given_at: float
    deadline: float
    source: str
    version: int = NOTICE_FORMAT

    def to_json(self) -> dict[str, Any]:
        payload = asdict(self)
        return {"version": self.version, **{k: v for k, v in payload.items() if k != "version"}}

    def seconds_left(self, now: float | None = None) -> float:
        return self.deadline - (time.time() if now is None else now)


def grace_seconds(environ: Mapping[str, str]) -> float:
    """`TRAINGUARD_NOTICE_GRACE_SECONDS` when it is a number of seconds, else the default 25."""
    try:
        value = float(environ.get(NOTICE_GRACE_ENV, ""))
    except ValueError:
        return DEFAULT_GRACE_SECONDS
    return value if 0 <= value < 86_400 else DEFAULT_GRACE_SECONDS


def _time(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def parse_notice(payload: object) -> Notice | None:
    """The `Notice` in a decoded JSON value, or None when it is not one."""
    if not isinstance(payload, dict) or payload.get("version") != NOTICE_FORMAT:
        return None
    reason, given_at, deadline, source = (payload.get("reason"), _time(payload.get("given_at")),
                                          _time(payload.get("deadline")), payload.get("source"))
    if reason not in REASONS or given_at is None or deadline is None or not isinstance(source, str):
        return None
    return Notice(str(reason), given_at, deadline, source[:_SOURCE_CHARS])


def read_notice(path: Path | str | None) -> Notice | None:
    """The notice at ``path``; None when there is none or it is not a well-formed notice."""
    if not path:
        return None
    try:
        data = safefiles.read_bytes(path, limit_bytes=_LIMIT_BYTES)
        return parse_notice(json.loads(data.decode("utf-8")))
    except (OSError, ValueError, RecursionError):
        return None


def write_notice(path: Path | str, notice: Notice) -> None:
    """Write ``notice`` atomically (temporary name, fsync, rename)."""
    write_bytes_atomic(Path(path), (json.dumps(notice.to_json()) + "\n").encode("utf-8"))


def give_notice(path: Path | str, reason: str, grace: float, source: str, now: float | None = None) -> Notice:
    """Write a notice of ``reason`` with a deadline ``grace`` seconds from now; the notice written."""
    given = time.time() if now is None else now
    notice = Notice(reason, given, given + grace, source)
    write_notice(path, notice)
    return notice


def notice_path(environ: Mapping[str, str]) -> Path | None:
    value = environ.get(NOTICE_FILE_ENV)
    return Path(value) if value else None


def current_notice(environ: Mapping[str, str] = os.environ, *, not_before: float = 0.0) -> Notice | None:
    """The notice the environment's notice file holds, if it was given at or after ``not_before``."""
    notice = read_notice(notice_path(environ))
    return notice if notice is not None and notice.given_at >= not_before else None
