"""Cutting blocks of log into chunks, and running the engine one block ahead of the reader.

Hyperscan releases the GIL while it scans, so the engine's pass over the next block runs on a
second thread while this thread reads the lines of the current one: a long log uses two cores,
and at most two blocks (plus the one coming off the disk) are held at once. On a noisy log the
engine's database may also find the lines holding the noisy patterns' literals (``noisy``), in
the same pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trainguard.core.triage.engines import Chunk, HyperscanEngine, ReEngine
from trainguard.core.triage.lineshapes import ChunkLines

__all__ = ["Answer", "Block", "CHUNK_BYTES", "LineDatabase", "ahead", "chunks"]

CHUNK_BYTES = 256 << 10

Block = tuple[bytes, int, int]  # buffer, start, stop: the lines in buffer[start:stop]
# A database that also reports the ends of lines holding the literals of the patterns given.
LineDatabase = tuple[Any, frozenset[int]]
# For each chunk, the patterns present; with a LineDatabase, also its lines holding those
# literals (by shape, up to MAX_LINES), and which patterns' literals those lines were found for.
Answer = tuple[list[list[int]], list[ChunkLines] | None, frozenset[int]]
MAX_LINES = 384  # past this many such lines in a chunk, the chunk is read whole instead


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


def ahead(engine: ReEngine | HyperscanEngine, source: Iterator[Block],
          lines: Callable[[], LineDatabase | None] = lambda: None,
          ) -> Iterator[tuple[bytes, int, int, Answer | None]]:
    """The blocks, each with the engine's answer worked out on a second thread while the
    previous block's lines are read here: Hyperscan releases the GIL while it scans, so a long
    log uses two cores. A log of one block is scanned in line, without a thread. ``lines`` says,
    as each block is handed to the engine, which line database to scan it with, if any."""
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
    with ThreadPoolExecutor(1, thread_name_prefix="triage-scan") as pool:
        answer = pool.submit(_present, engine, first, lines())
        current: Block | None = first
        upcoming: Block | None = second
        del first, second
        while current is not None:
            result = answer.result()
            if upcoming is not None:  # the engine reads the next block while this one is read here
                answer = pool.submit(_present, engine, upcoming, lines())
            buf, start, stop = current
            current = None
            yield buf, start, stop, result
            del buf
            current, upcoming = upcoming, None
            if current is not None:
                upcoming = next(source, None)


def _present(engine: HyperscanEngine, block: Block, lines: LineDatabase | None) -> Answer:
    buf, start, stop = block
    parts = chunks(buf, start, stop)
    if lines is None:
        return engine.present(buf, parts), None, frozenset()
    present, found = engine.present_lines(buf, parts, *lines, MAX_LINES)
    return present, found, lines[1]
