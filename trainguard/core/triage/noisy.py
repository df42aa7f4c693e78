"""Finding, in one Hyperscan pass, the lines of a chunk that hold a literal of the patterns a
noisy log keeps reporting.

On a log where most chunks hold a checkpoint save, a retried request or a socket warning, the
same few patterns are present in nearly every chunk, and their lines are of a few digit-masked
shapes already known to fail. Masking and splitting the whole chunk to find those shapes costs
several passes over every byte in Python; a small database of those patterns' literals, each
followed by the rest of its line, reports each line holding one once, at its end, and only those
lines are masked. Which patterns are noisy is learnt as the log is read; where Hyperscan cannot
be imported, or a chunk holds too many such lines, the caller masks the whole chunk as before.

The engine, a block ahead on its own thread, reports each noisy pattern once in nearly every
chunk, and each report waits for the interpreter this thread keeps busy: the two threads take
turns instead of sharing two cores. The engine's database without the noisy patterns reports
nothing on such a log, so its pass over a block runs on its own core, and the noisy patterns are
looked for only here, where their lines are found anyway. Compiling that database takes about as
long as the rules' own (~0.4 s): it is compiled for a set of noisy patterns once a log has shown
itself long (``NARROW_AFTER`` noisy chunks) and kept in the same cache, from which a later scan
of such a log takes it at once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from trainguard.core.triage.engines import LINE_FLAGS, Finders, HyperscanEngine
from trainguard.core.triage.lineshapes import MASK, LineShapes
from trainguard.core.triage.pipeline import MAX_LINES, Without

_hs: Any
try:  # an accelerator only: without it every chunk is masked whole
    import hyperscan as _hs
except ImportError:  # pragma: no cover - exercised where hyperscan is not installed
    _hs = None

# Past MAX_LINES candidate lines in a chunk, masking all of it costs less than a callback and a
# look-up per line; the next chunks are then masked whole, and then tried again.
MASK_WHOLE_AFTER_OVERFLOW = 16
Shapes = LineShapes  # a chunk's distinct digit-masked lines, and where their lines start
NOISY_CHUNKS = 2  # a pattern present in this many chunks is looked for by its literals
MAX_BUILDS = 8
NARROW_AFTER = 1024  # noisy chunks (256 MiB) before the narrower database is compiled


class LiteralLines:
    """The lines holding a literal of the noisy patterns, by digit-masked shape; one per scan."""

    def __init__(self, finders: Finders, engine: HyperscanEngine | None = None) -> None:
        self.finders = finders
        self.engine = engine
        self.narrowed: Without | None = None  # the engine's database without self.pids
        self.looked = True  # whether the cache was asked for the engine's database of self.pids
        self.used = 0  # chunks whose lines were found by the small database, since it was built
        self.seen: Counter[int] = Counter()
        self.pids: frozenset[int] = frozenset()
        # Masked lines known to fail, or to lack the literals of, every pattern of self.pids
        # whose rule may still match (the collector's judgement): no such line can be a hit.
        self.judged: set[bytes] = set()
        self.builds = 0
        self.whole = 0  # chunks still to mask whole after one held too many lines
        self._db: Any = None
        self._scratch: Any = None

    def database(self) -> Without | None:
        """The database to give the engine the next block with, once had: the engine's without
        the noisy patterns, which may then occur in any chunk."""
        return self.narrowed

    def shapes(self, buf: bytes, a: int, b: int, pids: list[int]) -> Shapes | None:
        """The shapes of the lines of ``buf[a:b]`` that may match one of ``pids``, with where
        those lines start; None when the caller should mask the whole chunk instead."""
        self.seen.update(pids)
        if self.whole:
            self.whole -= 1
            return None
        if _hs is None or (not self.pids.issuperset(pids) and not self._build(pids)):
            return None
        self._narrow()
        shapes = LineShapes(buf, a, MAX_LINES)  # one report per line: one expression, at its end
        try:
            self._db.scan(memoryview(buf)[a:b], scratch=self._scratch,
                          match_event_handler=shapes.handler)
        except _hs.error:  # stopped (too many lines), or failed: the whole chunk is masked
            self.whole = MASK_WHOLE_AFTER_OVERFLOW
            return None
        if shapes.lines > MAX_LINES:
            self.whole = MASK_WHOLE_AFTER_OVERFLOW
            return None
        return shapes

    def _build(self, pids: list[int]) -> bool:
        """Compile the literals of the noisy patterns; False if they cannot be used for ``pids``."""
        if self.builds >= MAX_BUILDS or any(self.seen[pid] < NOISY_CHUNKS for pid in pids):
            return False
        wanted = self.pids | frozenset(pids)
        literals: set[bytes] = set()
        for pid in wanted:
            finder = self.finders[pid]
            if finder.literals is None or any(b"\n" in lit for lit in finder.literals):
                return False
            literals.update(finder.literals)
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        try:  # caseless for all: a few more lines, but one report per line (the engine's flags)
            db.compile(expressions=[_rest_of_line(_shortest(literals))], ids=[0],
                       flags=[LINE_FLAGS])
        except _hs.error:
            self.builds = MAX_BUILDS
            return False
        self._db, self._scratch = db, _hs.Scratch(db)
        self.pids = wanted
        self.judged.clear()  # judged for fewer patterns than are now looked for
        self.builds += 1
        self.narrowed, self.looked, self.used = None, False, 0
        return True

    def _narrow(self) -> None:
        """Take the engine's database without the noisy patterns from the cache once; compile
        it once the log is long."""
        self.used += 1
        if self.engine is None or (self.looked and self.used != NARROW_AFTER):
            return
        db = self.engine.without(self.pids, cached_only=not self.looked)
        self.looked = True
        if db is not None:
            self.narrowed = (db, self.pids)


def _shortest(literals: set[bytes]) -> list[bytes]:
    """The literals that hold no other (caseless, as they are looked for): a line holding
    "HTTPError" or "Read timed out" holds "HTTP" or "timed out", and every literal the scan has
    to try at each byte costs it time."""
    lowered = sorted({lit.lower(): lit for lit in sorted(literals)}.items(),
                     key=lambda item: (len(item[0]), item[0]))
    kept: list[tuple[bytes, bytes]] = []
    for low, lit in lowered:
        if not any(other in low for other, _ in kept):
            kept.append((low, lit))
    return sorted(lit for _, lit in kept)


def _rest_of_line(literals: list[bytes]) -> bytes:
    """One literal of the list, then the rest of its line: it matches once per line, at its end."""
    return b"(?:" + b"|".join(_escaped(lit) for lit in literals) + b")[^\\n]*$"


def _escaped(literal: bytes) -> bytes:
    return b"".join(bytes([c]) if chr(c).isalnum() and c < 128 else b"\\x%02x" % c
                    for c in literal)


def lines_of(masked: bytes, shape: bytes, base: int) -> list[int]:
    """Where the lines that read ``shape`` once masked start (offsets into the block)."""
    out = []
    size, end = len(shape), len(masked)
    i = masked.find(shape)
    while i >= 0:
        if (i == 0 or masked[i - 1] == 10) and (i + size == end or masked[i + size] == 10):
            out.append(base + i)
        i = masked.find(shape, i + max(size, 1))
    return out


def shape_at(buf: bytes, start: int, stop: int) -> bytes:
    """The digit-masked text of the line starting at ``start``."""
    end = buf.find(b"\n", start, stop)
    return buf[start:stop if end < 0 else end].translate(MASK)
