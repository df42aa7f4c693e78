"""Collecting, as an engine reports them, the lines of a chunk by digit-masked shape.

An engine reports a line expression once per line, at the line's end. Each report is a call
into Python, so the call does the least it can: it records where the line ends. The reported
lines are then found, masked and told apart all at once, in a few passes in C over their text
(a join, one translation, one split and a set), and the lines of each shape are listed only for
a shape the caller asks about: on a noisy log, nearly every shape is one already judged, and a
thousand checkpoint saves of one shape are one key.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["LineShapes", "MASK"]

MASK = bytes.maketrans(b"123456789", b"000000000")  # every digit reads as 0

Handler = Callable[[int, int, int, int, object], bool]


class LineShapes:
    """The lines reported for one chunk ``buf[a:...]``, by shape.

    ``handler`` is the engine's match callback: each report is a line, at its end (relative to
    ``a``). Past ``limit`` lines the scan is stopped, and the caller reads the chunk whole.
    ``keys()`` are the distinct shapes of the lines reported; ``self[shape]`` where the lines of
    that shape start.
    """

    __slots__ = ("handler", "_buf", "_a", "_ends", "_shapes", "_masked", "_starts", "_by_shape")

    def __init__(self, buf: bytes, a: int, limit: int) -> None:
        # A chunk starts a line: at 0 or after a newline, so looking from the byte before it,
        # the first line's start is found too.
        assert a == 0 or buf[a - 1] == 10, "a chunk starts at the start of a line"
        ends: list[int] = []
        push = ends.append

        def handler(_pid: int, _from: int, to: int, _flags: int, _context: object) -> bool:
            push(to)
            return len(ends) > limit  # True stops the scan

        self.handler: Handler = handler
        self._buf, self._a, self._ends = buf, a, ends
        self._shapes: set[bytes] | None = None
        self._masked: list[bytes] = []
        self._starts: list[int] = []
        self._by_shape: dict[bytes, list[int]] | None = None

    @property
    def lines(self) -> int:
        """How many lines were reported, up to one past the limit."""
        return len(self._ends)

    def keys(self) -> set[bytes]:
        """The distinct digit-masked lines reported."""
        if self._shapes is None:
            buf, a = self._buf, self._a
            rfind, low = buf.rfind, max(a - 1, 0)
            ends = [a + to for to in self._ends]
            self._starts = starts = [rfind(b"\n", low, end) + 1 for end in ends]
            if ends:  # lines hold no newline: joined by one, masked, they split back apart
                self._masked = b"\n".join([buf[start:end] for start, end in zip(starts, ends)]
                                          ).translate(MASK).split(b"\n")
            self._shapes = set(self._masked)
        return self._shapes

    def __getitem__(self, shape: bytes) -> list[int]:
        """Where the reported lines of ``shape`` start (offsets into the buffer)."""
        if self._by_shape is None:
            self.keys()
            by_shape: dict[bytes, list[int]] = {}
            for masked, start in zip(self._masked, self._starts):
                by_shape.setdefault(masked, []).append(start)
            self._by_shape = by_shape
        return self._by_shape[shape]
