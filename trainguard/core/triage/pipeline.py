"""Cutting blocks of log into chunks, and running the engine one block ahead of the reader.

Hyperscan releases the GIL while it scans, so the engine's pass over the next block runs on a
second thread while this thread reads the lines of the current one: a long log uses two cores,
and at most two blocks (plus the one coming off the disk) are held at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from trainguard.core.triage.engines import Chunk, HyperscanEngine, ReEngine

__all__ = ["Block", "CHUNK_BYTES", "ahead", "chunks"]

CHUNK_BYTES = 256 << 10

Block = tuple[bytes, int, int]  # buffer, start, stop: the lines in buffer[start:stop]


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


def ahead(engine: ReEngine | HyperscanEngine,
          source: Iterator[Block]) -> Iterator[tuple[bytes, int, int, list[list[int]] | None]]:
    """The blocks, each with the engine's answer worked out on a second thread while the
    previous block's lines are read here: Hyperscan releases the GIL while it scans, so a long
    log uses two cores. A log of one block is scanned in line, without a thread."""
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
        answer = pool.submit(_present, engine, first)
        current: Block | None = first
        upcoming: Block | None = second
        del first, second
        while current is not None:
            result = answer.result()
            if upcoming is not None:  # the engine reads the next block while this one is read here
                answer = pool.submit(_present, engine, upcoming)
            buf, start, stop = current
            current = None
            yield buf, start, stop, result
            del buf
            current, upcoming = upcoming, None
            if current is not None:
                upcoming = next(source, None)


def _present(engine: HyperscanEngine, block: Block) -> list[list[int]]:
    buf, start, stop = block
    return engine.present(buf, chunks(buf, start, stop))
