"""Collecting, as an engine reports them, the lines of a chunk by digit-masked shape.

An engine reports a line expression once per line, at the line's end. Each report is a call
into Python; doing the line's whole share of the work in that call (finding its start, masking
its digits, filing it under its shape) costs little more than recording its end, and spares a
second pass over every reported line afterwards. What the scan then looks at is one entry per
distinct shape: a thousand checkpoint saves of one shape are one key.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ChunkLines", "LineShapes", "MASK"]

MASK = bytes.maketrans(b"123456789", b"000000000")  # every digit reads as 0

# The lines of a chunk that an expression reported: where each distinct digit-masked line
# starts (in order, first occurrence first), and how many lines were reported in all.
ChunkLines = tuple[dict[bytes, list[int]], int]

Handler = Callable[[int, int, int, int, object], bool]


class LineShapes:
    """The lines reported for one chunk ``buf[a:...]``, filed by shape as they are reported.

    ``handler`` is the engine's match callback: reports of ``line_id`` are lines (at their ends,
    relative to ``a``), any other id is appended to ``others``. Past ``limit`` lines, lines are
    only counted, and the scan is stopped if ``stop`` (the caller then reads the chunk whole).
    """

    __slots__ = ("by_shape", "handler", "_count")

    def __init__(self, buf: bytes, a: int, limit: int, line_id: int = 0,
                 others: list[int] | None = None, stop: bool = True) -> None:
        # A chunk starts a line: at 0 or after a newline, so looking from the byte before it,
        # the first line's start is found too.
        assert a == 0 or buf[a - 1] == 10, "a chunk starts at the start of a line"
        by_shape: dict[bytes, list[int]] = {}
        found = others if others is not None else []
        count = 0
        rfind, get, low = buf.rfind, by_shape.get, max(a - 1, 0)

        def handler(pid: int, _from: int, to: int, _flags: int, _context: object) -> bool:
            nonlocal count
            if pid != line_id:
                found.append(pid)
                return False
            count += 1
            if count > limit:
                return stop  # True stops the scan
            end = a + to
            start = rfind(b"\n", low, end) + 1
            shape = buf[start:end].translate(MASK)
            starts = get(shape)
            if starts is None:
                by_shape[shape] = [start]
            else:
                starts.append(start)
            return False

        self.by_shape = by_shape
        self.handler: Handler = handler
        self._count: Callable[[], int] = lambda: count

    @property
    def lines(self) -> int:
        """How many lines were reported (past the limit, they are counted, not filed)."""
        return self._count()

    def result(self) -> ChunkLines:
        return self.by_shape, self.lines
