"""Multi-pattern engines: find, in one block of log bytes, the lines any rule pattern may match.

Two engines give the same answers: Hyperscan (one compiled database, one pass, cached on disk
because compiling costs more than the rest of ``trainguard classify``) and pure ``re`` for
machines where Hyperscan cannot be imported. The ``re`` engine looks for a literal every match
must contain (found from the parsed pattern) with ``bytes.find`` and runs the regex only on the
lines holding it. Engines say which patterns occur in each line-aligned chunk of a block;
``LineFinder`` lists a pattern's lines in a chunk; confirming a line against the stripped text is
``scan``'s business.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.core.triage.lineshapes import MASK
from trainguard.core.triage.literals import loosened, required_literals

_hs: Any
try:  # Hyperscan is an optional accelerator; the pure-re engine gives the same answers.
    import hyperscan as _hs
except ImportError:  # pragma: no cover - exercised by forcing engine="re" in tests
    _hs = None

LINE_FLAGS = (_hs.HS_FLAG_MULTILINE | _hs.HS_FLAG_CASELESS) if _hs is not None else 0
_BOUNDED_ANY = re.compile(r"(?<!\\)\.\{\d*,\d+\}")


@dataclass(frozen=True)
class Pattern:
    """One rule pattern as the engines see it."""

    rule: int
    source: str  # the rule's regex
    is_context: bool
    prefilter: bytes
    caseless: bool

    @property
    def regex(self) -> re.Pattern[str]:
        """The rule's regex, compiled on first use (then from ``re``'s own cache)."""
        return re.compile(self.source, re.IGNORECASE if self.caseless else 0)


def prefilter_source(pattern: str) -> bytes:
    """The pattern as run over raw bytes: a superset of the lines the exact check accepts."""
    # Rules match the stripped line, the engine sees the raw one with its prefixes: drop anchors.
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    # Bounded repeats of "any character" cost Hyperscan compile time and memory; the exact check
    # enforces the bound, so the prefilter may accept any run within the line.
    pattern = _BOUNDED_ANY.sub(".*", pattern)
    return pattern.encode("utf-8")


def candidate_source(pattern: str) -> bytes:
    """What the engines look for: the prefilter without the words every progress line prints."""
    return loosened(prefilter_source(pattern).decode("utf-8")).encode("utf-8")


Chunk = tuple[int, int]  # a line-aligned byte range of the block being scanned


class LineFinder:
    """The lines of a byte range that one pattern matches, found with C-speed searches.

    A literal every match must contain is looked for with ``bytes.find`` and the regex runs only
    on the line holding it; patterns without such a literal run as one ``finditer``.
    """

    def __init__(self, p: Pattern) -> None:
        self.caseless = p.caseless or "(?i" in p.source
        flags = re.MULTILINE | (re.IGNORECASE if p.caseless else 0)
        self.regex = re.compile(p.prefilter, flags)
        literals = required_literals(p.prefilter.decode("utf-8"))
        self.literals = [lit.lower() for lit in literals] if literals and self.caseless \
            else literals
        # The same literals as they read in a digit-masked line ("Errno 28" -> "Errno 00").
        self.masked = None if self.literals is None else list(dict.fromkeys(
            lit.translate(MASK) for lit in self.literals))

    def first(self, buf: bytes, start: int, stop: int, lowered: bytes | None, base: int,
              memo: dict[int, tuple[int, int]] | None = None) -> int:
        """Where the first matching line in ``buf[start:stop]`` starts, or -1.

        ``lowered`` is ``buf[base:...].lower()`` when the pattern is caseless (else unused).
        ``memo`` carries each literal's last answer between calls on one range that move
        forward, so that a literal seen far ahead is not searched for again line after line.
        """
        if self.literals is None:
            m = self.regex.search(buf, start, stop)
            return -1 if m is None else buf.rfind(b"\n", 0, m.start()) + 1
        memo = {} if memo is None else memo
        best = -1
        for index, lit in enumerate(self.literals):
            since, line = memo.get(index, (stop + 1, -1))
            if not (since <= start and (line == -1 or line >= start)):
                line = self._first_of(lit, buf, start, stop, lowered, base)
                memo[index] = (start, line)
            if line >= 0 and (best < 0 or line < best):
                best = line
        return best

    def _first_of(self, lit: bytes, buf: bytes, start: int, stop: int, lowered: bytes | None,
                  base: int) -> int:
        hay, off = (lowered, base) if self.caseless and lowered is not None else (buf, 0)
        pos = start
        while pos < stop and (i := hay.find(lit, pos - off, stop - off)) >= 0:
            at = i + off
            line_start = buf.rfind(b"\n", 0, at) + 1
            line_end = buf.find(b"\n", at, stop)
            line_end = stop if line_end < 0 else line_end
            if line_start >= start and self.regex.search(buf, line_start, line_end):
                return line_start
            pos = line_end + 1
        return -1

    def shapes(self, text: bytes, lowered: bytes | None) -> list[bytes] | None:
        """The lines of ``text`` (distinct digit-masked lines, one per line) that may match.

        None when the pattern has no literal to look for; then only the real lines will do.
        ``lowered`` is ``text.lower()`` when the pattern is caseless.
        """
        if self.masked is None:
            return None
        hay = lowered if self.caseless and lowered is not None else text
        out: dict[bytes, None] = {}
        for lit in self.masked:
            i = hay.find(lit)
            while i >= 0:
                line_start = text.rfind(b"\n", 0, i) + 1
                line_end = text.find(b"\n", i)
                line_end = len(text) if line_end < 0 else line_end
                out[text[line_start:line_end]] = None
                i = hay.find(lit, line_end + 1)
        return list(out)

    def candidates(self, buf: bytes, start: int, stop: int,
                   lowered: bytes | None) -> list[tuple[int, int]]:
        """(start, end) of the lines of the chunk ``buf[start:stop]`` that may match.

        Unverified: every line holding one of the pattern's literals (or matched by its regex,
        when it has none); the caller confirms each line, and remembers what it rejected.
        ``lowered`` is ``buf[start:stop].lower()`` when the pattern is caseless.
        """
        out: list[tuple[int, int]] = []
        if self.literals is None:
            pos = start
            while (m := self.regex.search(buf, pos, stop)) is not None:
                line_start = buf.rfind(b"\n", start, m.start()) + 1 or start
                line_end = buf.find(b"\n", m.start(), stop)
                line_end = stop if line_end < 0 else line_end
                out.append((line_start, line_end))
                pos = line_end + 1
            return out
        hay, off = (lowered, start) if self.caseless and lowered is not None else (buf, 0)
        for lit in self.literals:
            i = hay.find(lit, start - off, stop - off)
            while i >= 0:
                line_start = buf.rfind(b"\n", start, i + off) + 1 or start
                line_end = buf.find(b"\n", i + off, stop)
                line_end = stop if line_end < 0 else line_end
                out.append((line_start, line_end))
                i = hay.find(lit, line_end + 1 - off, stop - off)
        return out


class Finders:
    """One ``LineFinder`` per pattern, built on first use: parsing for literals is not free."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self._patterns = patterns
        self._built: dict[int, LineFinder] = {}
        self._lock = threading.Lock()

    def __getitem__(self, pid: int) -> LineFinder:
        finder = self._built.get(pid)
        if finder is None:
            with self._lock:
                finder = self._built.setdefault(pid, LineFinder(self._patterns[pid]))
        return finder

    def __len__(self) -> int:
        return len(self._patterns)


class ReEngine:
    """Pure-``re`` engine: which patterns occur in which chunk, by literal search and regex."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self.finders = [LineFinder(p) for p in patterns]

    def present(self, buf: bytes, chunks: Sequence[Chunk]) -> list[list[int]]:
        """For each chunk, the ids of the patterns that occur in it."""
        out: list[list[int]] = [[] for _ in chunks]
        if not chunks:
            return out
        start, stop = chunks[0][0], chunks[-1][1]
        ends = [c[1] for c in chunks]
        lowered = buf[start:stop].lower() if any(f.caseless for f in self.finders) else None
        for pid, finder in enumerate(self.finders):
            pos = start
            memo: dict[int, tuple[int, int]] = {}
            while pos < stop and (line := finder.first(buf, pos, stop, lowered, start, memo)) >= 0:
                index = bisect.bisect_right(ends, line)
                out[index].append(pid)
                pos = ends[index]  # one report per pattern and chunk is all that is needed
        return out


class HyperscanEngine:
    """Hyperscan block mode over line-aligned chunks; patterns it refuses fall to ``re``.

    The database is compiled single-match: one scan per chunk reports each pattern that occurs
    in it at most once, so a chunk of a thousand checkpoint saves costs what a chunk of one
    does. The collector then finds, by literal search, the lines of the patterns whose rule still
    needs them.
    """

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        assert _hs is not None
        ok = list(range(len(patterns)))
        self._db = _cached_database(patterns, ok, single=True)
        if self._db is None:
            ok = [i for i, p in enumerate(patterns) if _compiles(p)]
            self._db = _cached_database(patterns, ok, single=True) if ok else None
        accepted = set(ok)
        self._rest_ids = [i for i in range(len(patterns)) if i not in accepted]
        rest = [patterns[i] for i in self._rest_ids]
        self._rest = ReEngine(rest) if rest else None
        self._patterns, self._ok = patterns, ok
        # Hyperscan scratch space is per scan in flight: one per thread (Prefect runs tasks on
        # threads), cloned from the database's own.
        self._local = threading.local()

    def present(self, buf: bytes, chunks: Sequence[Chunk]) -> list[list[int]]:
        """For each chunk, the ids of the patterns that occur in it."""
        out: list[list[int]] = []
        view = memoryview(buf)
        scratch = self._scratch() if self._db is not None else None
        for a, b in chunks:
            found: list[int] = []
            if self._db is not None:
                self._db.scan(view[a:b], scratch=scratch,
                              match_event_handler=lambda pid, *_: found.append(pid))
            out.append(found)
        if self._rest is not None:
            ids = self._rest_ids
            for index, pids in enumerate(self._rest.present(buf, chunks)):
                out[index].extend(ids[pid] for pid in pids)
        return out

    def without(self, pids: frozenset[int], cached_only: bool) -> Any:
        """The patterns' database less ``pids``, the patterns a noisy log keeps reporting: their
        lines are found by the collector's own pass (``noisy``), and on such a log the rest are
        reported so rarely that a block's pass needs the interpreter only as it ends. From the
        cache only if ``cached_only``; None if not had or if it does not compile."""
        if self._db is None or self._rest is not None:
            return None
        ids = [i for i in self._ok if i not in pids]
        return _cached_database(self._patterns, ids, single=True, cached_only=cached_only)

    def present_without(self, buf: bytes, chunks: Sequence[Chunk], db: Any,
                        pids: frozenset[int]) -> list[list[int]]:
        """For each chunk, the patterns that may occur in it, from ``db`` (a database from
        ``without``): ``pids`` are said to occur everywhere, for the caller to look for.

        The block is scanned once; only when something occurs in it are its chunks scanned one
        by one. Chunks begin and end at line starts, so a match within a line of a chunk is a
        match in the block: a block without one has none in any chunk.
        """
        view = memoryview(buf)
        scratch = self._scratch(db)
        also = sorted(pids)
        found: list[int] = []
        if chunks:
            db.scan(view[chunks[0][0]:chunks[-1][1]], scratch=scratch,
                    match_event_handler=lambda pid, *_: found.append(pid))
        if not found:
            return [list(also) for _ in chunks]
        out: list[list[int]] = []
        for a, b in chunks:
            found = []
            db.scan(view[a:b], scratch=scratch,
                    match_event_handler=lambda pid, *_: found.append(pid))
            out.append(found + also)
        return out

    def _scratch(self, db: Any = None) -> Any:
        db = self._db if db is None else db
        scratches = getattr(self._local, "scratches", None)
        if scratches is None:
            scratches = self._local.scratches = {}
        scratch = scratches.get(id(db))
        if scratch is None:
            scratch = scratches[id(db)] = _hs.Scratch(db)
        return scratch


def hyperscan_available() -> bool:
    """Whether the Hyperscan engine can be used on this machine."""
    return _hs is not None


def make_engine(patterns: Sequence[Pattern], engine: str = "auto") -> ReEngine | HyperscanEngine:
    """The fastest engine available, or the one asked for ("hyperscan" or "re")."""
    if engine not in ("auto", "hyperscan", "re"):
        raise ValueError(f"engine: {engine!r}; expected auto, hyperscan or re")
    if engine == "re" or (engine == "auto" and _hs is None):
        return ReEngine(patterns)
    if _hs is None:
        raise RuntimeError("engine='hyperscan' asked for, but hyperscan cannot be imported")
    return HyperscanEngine(patterns)


def _flags(p: Pattern, single: bool = False) -> int:
    assert _hs is not None
    flags = (_hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_MULTILINE | _hs.HS_FLAG_ALLOWEMPTY
             | (_hs.HS_FLAG_SINGLEMATCH if single else 0))
    return int(flags | (_hs.HS_FLAG_CASELESS if p.caseless else 0))


def _compiles(p: Pattern) -> bool:
    assert _hs is not None
    try:
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        db.compile(expressions=[p.prefilter], ids=[0], flags=[_flags(p)])
    except _hs.error:
        return False
    return True


def _cache_dir() -> Path | None:
    """$TRAINGUARD_CACHE_DIR, else $XDG_CACHE_HOME/trainguard or ~/.cache/trainguard."""
    if os.environ.get("TRAINGUARD_CACHE_DIR"):
        return Path(os.environ["TRAINGUARD_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    try:
        return (Path(xdg) if xdg else Path.home() / ".cache") / "trainguard"
    except RuntimeError:  # no home directory to expand
        return None


def _cached_database(patterns: Sequence[Pattern], ids: Sequence[int], single: bool = False,
                     cached_only: bool = False) -> Any:
    """Compile (or load the cached compilation of) the patterns; None if one does not compile.

    Compiling a few hundred patterns takes Hyperscan about half a second, longer than the rest of
    ``trainguard classify`` together, so the serialised database is kept in the user's cache.
    """
    assert _hs is not None
    described = [(i, patterns[i].prefilter, _flags(patterns[i], single)) for i in ids]
    key = hashlib.sha256(repr((getattr(_hs, "__version__", ""), described)).encode()
                         ).hexdigest()[:24]
    folder = _cache_dir()
    path = folder / f"hs-{key}.db" if folder is not None else None
    db = None
    if path is not None and path.is_file():
        try:
            db = _hs.loadb(path.read_bytes(), mode=_hs.HS_MODE_BLOCK)
        except (_hs.error, OSError):
            db = None
    if db is None and cached_only:
        return None
    if db is None:
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        try:
            db.compile(expressions=[patterns[i].prefilter for i in ids], ids=list(ids),
                       flags=[_flags(patterns[i], single) for i in ids])
        except _hs.error:
            return None
        if path is not None:
            _store(path, _hs.dumpb(db))
    db.scratch = _hs.Scratch(db)
    return db


def _store(path: Path, data: bytes) -> None:
    # Best effort: a read-only home must not stop triage, only make it slower to start.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass
