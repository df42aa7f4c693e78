"""Cutting blocks of log into chunks, and running the engine one block ahead of the reader.

Hyperscan releases the GIL while it scans, so the engine's pass over the next block runs on a
second thread while this thread reads the lines of the current one: a long log uses two cores,
and at most two whole blocks (plus the one coming off the disk) are held at once. On a long noisy
log the engine scans with a database without the patterns the log keeps reporting (their lines are
found here, ``noisy``): its pass then needs the interpreter only as it ends, not at every chunk.
What the blocks leave behind, the log's last whole lines (``Tail``), is kept here too.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from trainguard.core.triage.engines import Chunk, HyperscanEngine, ReEngine

__all__ = ["Answer", "Block", "CHUNK_BYTES", "Tail", "Without", "ahead", "chunks"]

CHUNK_BYTES = 256 << 10

Block = tuple[bytes, int, int]  # buffer, start, stop: the lines in buffer[start:stop]
# A database of the patterns without those given, which may then occur in any chunk.
Without = tuple[Any, frozenset[int]]
Answer = list[list[int]]  # for each chunk, the patterns that may occur in it
MAX_AHEAD = 3  # blocks handed to the engine and not yet read here, if none of them is whole
MAX_LINES = 384  # past this many noisy lines in a chunk, the chunk is read whole instead
# The interpreter's time slice while the engine runs a block ahead (its default is 5 ms).
SLICE_SECONDS = 0.0002
_slices = threading.Lock()
_slicing = [0, 0.0]  # scans under way, and the interval to restore after the last


def chunks(buf: bytes, start: int, stop: int) -> list[Chunk]:
    """Cut a block into line-aligned chunks of about CHUNK_BYTES."""
    out: list[Chunk] = []
    while start < stop:
        end = min(start + CHUNK_BYTES, stop)
        if end < stop:
            cut = buf.rfind(b"\n", start, end) + 1
            end = cut if cut > start else (buf.find(b"\n", end, stop) + 1 or stop)
        out.append((start, end))
        start = end
    return out


class Tail:
    """The last ``size`` bytes of a log, cut to whole lines, kept as the blocks go by."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.data = b""
        self.cut = False  # whether bytes before self.data were dropped

    def add(self, buf: bytes, start: int, stop: int) -> None:
        piece = buf[max(start, stop - self.size):stop]
        self.cut = self.cut or stop - start > len(piece)
        joined = self.data + piece
        if len(joined) > self.size:
            joined, self.cut = joined[-self.size:], True
        self.data = joined

    def lines(self, newlines: int) -> tuple[tuple[bytes, ...], int]:
        """The tail's whole lines and the number of the first, given the log's newline count."""
        data = self.data
        if self.cut:  # the first line may be a part of one
            data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
        lines = data.split(b"\n")
        total = newlines + (0 if lines[-1] == b"" else 1)
        if lines[-1] == b"":
            lines.pop()
        return tuple(lines), total - len(lines) + 1


def ahead(engine: ReEngine | HyperscanEngine, source: Iterator[Block],
          without: Callable[[], Without | None] = lambda: None,
          ) -> Iterator[tuple[bytes, int, int, Answer | None]]:
    """The blocks, each with the engine's answer worked out on a second thread while the
    previous block's lines are read here: Hyperscan releases the GIL while it scans, so a long
    log uses two cores. A log of one block is scanned in line, without a thread. ``without``
    says, as each block is handed to the engine, which narrower database to scan it with, if
    any."""
    first = next(source, None)
    if first is None:
        return
    second = next(source, None)
    if second is None or not isinstance(engine, HyperscanEngine):
        yield (*first, None)
        if second is not None:
            yield (*second, None)
            for block in source:
                yield (*block, None)
        return
    with _short_slices(), ThreadPoolExecutor(1, thread_name_prefix="triage-scan") as pool:
        inflight: deque[tuple[Block, Future[Answer]]] = deque()
        for block in (first, second):
            inflight.append((block, pool.submit(_present, engine, block, without())))
        del first, second, block
        while inflight:
            block, answer = inflight.popleft()
            # A log read in blocks of a fixed size comes as one whole block and the line that
            # straddled the last read, in turn: the engine must have a whole block in hand while
            # this one is read, not that one line, or the two threads take turns.
            while len(inflight) < MAX_AHEAD and not any(_whole(b) for b, _ in inflight) and (
                    upcoming := next(source, None)) is not None:
                inflight.append((upcoming, pool.submit(_present, engine, upcoming, without())))
                del upcoming
            result = answer.result()
            del answer
            buf, start, stop = block
            del block
            yield buf, start, stop, result
            del buf


def _whole(block: Block) -> bool:
    """Whether the block is more than the one line a read left over."""
    return block[2] - block[1] >= CHUNK_BYTES // 2


def _present(engine: HyperscanEngine, block: Block, without: Without | None) -> Answer:
    buf, start, stop = block
    parts = chunks(buf, start, stop)
    if without is None:
        return engine.present(buf, parts)
    return engine.present_without(buf, parts, *without)


@contextmanager
def _short_slices() -> Iterator[None]:
    """Shorter interpreter time slices while the engine runs a block ahead.

    The engine's thread needs the interpreter only as each block's pass starts and ends, but
    this thread keeps it busy reading lines: with the default slice of 5 ms, each of those
    moments can wait out a whole slice, so the two threads take turns instead of sharing two
    cores. The interval is the process's own; it is put back when the last scan ends.
    """
    with _slices:
        if _slicing[0] == 0:
            _slicing[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(SLICE_SECONDS, _slicing[1]))
        _slicing[0] += 1
    try:
        yield
    finally:
        with _slices:
            _slicing[0] -= 1
            if _slicing[0] == 0:
                sys.setswitchinterval(_slicing[1])
