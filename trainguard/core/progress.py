"""Training progress read from an attempt's log: (step, loss) points for the run report's chart and, where the
training-side helper kept no progress of its own, the last step the attempt completed (`checkpoints`).

Frameworks print progress in many shapes; what they share is a step number and, often, a loss
(`step 120/400 loss 0.5312`, `{'loss': 0.53, 'step': 120}`, `Epoch 3 | step 120 | loss=0.53`). The
log is untrusted and may be huge: it is read in bounded pieces, a line longer than the piece is
cut, undecodable bytes are replaced, and only a bounded, evenly thinned set of points is kept.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from trainguard_entrypoint import safefiles

MAX_POINTS = 48
_PIECE = 64 * 1024
_STEP = re.compile(r"""(?i)(?:\bglobal[_ ]step|\bstep|\biter(?:ation)?)['"]?\s*[:=]?\s*(\d{1,12})\b""")
_LOSS = re.compile(r"""(?i)\b(?:train[_ ])?loss['"]?\s*[:=]?\s*(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)\b""")

Point = tuple[int, float | None]


def _lines(stream: BinaryIO) -> Iterator[str]:
    while piece := stream.readline(_PIECE):
        if not piece.endswith(b"\n"):
            while (rest := stream.readline(_PIECE)) and not rest.endswith(b"\n"):
                pass  # the rest of an overlong line carries nothing a chart needs
        yield piece.decode("utf-8", errors="replace")


def parse_line(line: str) -> Point | None:
    """The (step, loss) a progress line reports; None when it reports no step."""
    step = _STEP.search(line)
    if step is None:
        return None
    loss = _LOSS.search(line)
    try:
        value = float(loss.group(1)) if loss else None
    except ValueError:
        value = None
    if value is not None and not math.isfinite(value):
        value = None  # a diverged loss: kept as a gap, since NaN is not JSON
    return int(step.group(1)), value


class _Reservoir:
    """Keeps every `stride`-th point, doubling the stride when full: bounded memory, even spacing."""

    def __init__(self, limit: int) -> None:
        self.limit, self.stride, self.seen = 2 * limit, 1, 0
        self.points: list[Point] = []
        self.last: Point | None = None

    def add(self, point: Point) -> None:
        if self.seen % self.stride == 0:
            self.points.append(point)
            if len(self.points) > self.limit:
                self.points, self.stride = self.points[::2], self.stride * 2
        self.seen += 1
        self.last = point

    def result(self) -> list[Point]:
        if self.last is not None and (not self.points or self.points[-1] is not self.last):
            return [*self.points, self.last]
        return self.points


def _thin(points: list[Point], limit: int) -> list[Point]:
    if len(points) <= limit:
        return points
    stride = len(points) / limit
    kept = [points[int(i * stride)] for i in range(limit - 1)]
    return [*kept, points[-1]]  # the last point is where the attempt got to: always shown


def read_points(log: Path | str | None, limit: int = MAX_POINTS) -> list[Point]:
    """Progress points of a log file (or of log text), oldest first, at most `limit` of them.

    Args:
        log: A log file, the log's text, or None.
        limit: How many points to keep; evenly thinned, the last point always kept.
    """
    if log is None:
        return []
    kept = _Reservoir(limit)
    if isinstance(log, Path):
        try:
            with safefiles.open_regular(log) as stream:  # the job's file: never a FIFO to wait on
                for line in _lines(stream):
                    if (point := parse_line(line)) is not None:
                        kept.add(point)
        except OSError:
            return []
    else:
        for line in log.splitlines():
            if (point := parse_line(line[:_PIECE])) is not None:
                kept.add(point)
    return _thin(kept.result(), limit)

