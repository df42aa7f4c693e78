"""Collecting, as an engine reports them, the lines of a chunk by digit-masked shape.

An engine reports a line expression once per line, at the line's end. Each report is a call
into Python; doing the line's whole share of the work in that call (finding its start, masking
its digits, filing it under its shape) costs little more than recording its end, and spares a
second pass over every reported line afterwards. What the scan then looks at is one entry per
distinct shape: a thousand checkpoint saves of one shape are one key.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["LineShapes", "MASK"]

MASK = bytes.maketrans(b"123456789", b"000000000")  # every digit reads as 0

Handler = Callable[[int, int, int, int, object], bool]


class LineShapes:
    """The lines reported for one chunk ``buf[a:...]``, filed by shape as they are reported.

    ``handler`` is the engine's match callback: each report is a line (at its end, relative to
    ``a``), filed under its shape, with where it starts. Past ``limit`` lines the scan is
    stopped, and the caller reads the chunk whole.
    """

    __slots__ = ("by_shape", "handler", "_count")

    def __init__(self, buf: bytes, a: int, limit: int) -> None:
        # A chunk starts a line: at 0 or after a newline, so looking from the byte before it,
        # the first line's start is found too.
        assert a == 0 or buf[a - 1] == 10, "a chunk starts at the start of a line"
        by_shape: dict[bytes, list[int]] = {}
        count = 0
        rfind, get, low = buf.rfind, by_shape.get, max(a - 1, 0)

        def handler(_pid: int, _from: int, to: int, _flags: int, _context: object) -> bool:
            nonlocal count
            count += 1
            if count > limit:
                return True  # stops the scan
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
        """How many lines were reported, up to one past the limit."""
        return self._count()
