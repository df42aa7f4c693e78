"""Streaming the log once through every rule's patterns, in bounded memory.

The log is read in blocks that end on a line break. One multi-pattern engine (Hyperscan when it
can be imported, Python's ``re`` otherwise) finds the lines any pattern may match; only those
lines are decoded, stripped of prefixes (``lines``) and checked with the rule's own regex, so the
cost of a long log does not grow with the number of rules. What is kept is bounded: the first
match of each rule on each rank, plus the last non-empty line for the fallback verdict.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trainguard.core.triage.lines import Line, read_line
from trainguard.core.triage.rules import Rule, RuleSet
from trainguard.core.triage.signals import LogSource

BLOCK_BYTES = 4 << 20
MAX_LINE_BYTES = 64 << 10
MAX_HITS = 4096
MAX_PENDING = 16

try:  # Hyperscan is an optional accelerator; the pure-re engine gives the same answers.
    import hyperscan as _hs
except ImportError:  # pragma: no cover - exercised by forcing engine="re" in tests
    _hs = None


@dataclass(frozen=True)
class Hit:
    """A verified match of one rule on one log line."""

    rule: int
    line_number: int
    line: Line


@dataclass(frozen=True)
class ScanResult:
    hits: tuple[Hit, ...]
    last_line: Line | None
    last_line_number: int | None


@dataclass(frozen=True)
class _Pattern:
    rule: int
    regex: re.Pattern[str]
    is_context: bool
    prefilter: bytes
    caseless: bool


def hyperscan_available() -> bool:
    """Whether the Hyperscan engine can be used on this machine."""
    return _hs is not None


_BOUNDED_ANY = re.compile(r"(?<!\\)\.\{\d*,\d+\}")


def _prefilter_source(pattern: str) -> bytes:
    # Rules match the stripped line, the engine sees the raw one with its prefixes: drop anchors
    # so the raw scan finds a superset of the lines the exact check then confirms.
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    # Bounded repeats of "any character" cost Hyperscan compile time and memory; the exact check
    # enforces the bound, so the prefilter may accept any run within the line.
    pattern = _BOUNDED_ANY.sub(".*", pattern)
    return pattern.encode("utf-8")


def patterns_of(rules: Sequence[Rule]) -> list[_Pattern]:
    """Every log and context pattern of the rules, in one flat table."""
    out: list[_Pattern] = []
    for index, rule in enumerate(rules):
        for regex in rule.log_res:
            out.append(_Pattern(index, regex, False, _prefilter_source(regex.pattern),
                                rule.ignore_case))
        for regex in rule.context_res:
            out.append(_Pattern(index, regex, True, _prefilter_source(regex.pattern),
                                rule.ignore_case))
    return out


Feed = Callable[[int, int], None]


class _ReEngine:
    """Pure-``re`` engine: one pass per pattern over each block (slow but always available)."""

    def __init__(self, patterns: Sequence[_Pattern]) -> None:
        flags = re.MULTILINE
        self._res = [(i, re.compile(p.prefilter, flags | (re.IGNORECASE if p.caseless else 0)))
                     for i, p in enumerate(patterns)]

    def scan(self, block: bytes, feed: Feed) -> None:
        found: list[tuple[int, int]] = []
        for pid, regex in self._res:
            last_line_start = -1
            for m in regex.finditer(block):
                start = block.rfind(b"\n", 0, m.start()) + 1
                if start != last_line_start:  # one report per line is all the check needs
                    found.append((max(m.end(), m.start() + 1), pid))
                    last_line_start = start
        found.sort()
        for end, pid in found:
            feed(pid, end)


class _HyperscanEngine:
    """Hyperscan block-mode engine over line-aligned blocks; unsupported patterns fall to re."""

    def __init__(self, patterns: Sequence[_Pattern]) -> None:
        assert _hs is not None
        ok = list(range(len(patterns)))
        self._db = _cached_database(patterns, ok)
        if self._db is None:
            ok = [i for i, p in enumerate(patterns) if _compiles(p)]
            self._db = _cached_database(patterns, ok) if ok else None
        self._rest_ids = [i for i in range(len(patterns)) if i not in set(ok)]
        rest = [patterns[i] for i in self._rest_ids]
        self._rest = _ReEngine(rest) if rest else None

    def scan(self, block: bytes, feed: Feed) -> None:
        if self._db is not None:
            def on_match(pid: int, _from: int, to: int, _flags: int, _ctx: Any) -> None:
                feed(pid, to)
            self._db.scan(block, match_event_handler=on_match)
        if self._rest is not None:
            ids = self._rest_ids
            self._rest.scan(block, lambda pid, end: feed(ids[pid], end))


def _cache_dir() -> Path | None:
    """$TRAINGUARD_CACHE_DIR, else $XDG_CACHE_HOME/trainguard or ~/.cache/trainguard."""
    if os.environ.get("TRAINGUARD_CACHE_DIR"):
        return Path(os.environ["TRAINGUARD_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    try:
        return (Path(xdg) if xdg else Path.home() / ".cache") / "trainguard"
    except RuntimeError:  # no home directory to expand
        return None


def _cached_database(patterns: Sequence[_Pattern], ids: Sequence[int]) -> Any:
    """Compile (or load the cached compilation of) the patterns; None if one does not compile.

    Compiling a few hundred patterns takes Hyperscan about half a second, longer than the rest of
    ``trainguard classify`` together, so the serialised database is kept in the user's cache.
    """
    assert _hs is not None
    key = hashlib.sha256(repr((getattr(_hs, "__version__", ""), [
        (i, patterns[i].prefilter, _flags(patterns[i])) for i in ids])).encode()).hexdigest()[:24]
    folder = _cache_dir()
    path = folder / f"hs-{key}.db" if folder is not None else None
    db = None
    if path is not None and path.is_file():
        try:
            db = _hs.loadb(path.read_bytes(), mode=_hs.HS_MODE_BLOCK)
        except (_hs.error, OSError):
            db = None
    if db is None:
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        try:
            db.compile(expressions=[patterns[i].prefilter for i in ids], ids=list(ids),
                       flags=[_flags(patterns[i]) for i in ids])
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


def _flags(p: _Pattern) -> int:
    assert _hs is not None
    flags = _hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_MULTILINE | _hs.HS_FLAG_ALLOWEMPTY
    return flags | (_hs.HS_FLAG_CASELESS if p.caseless else 0)


def _compiles(p: _Pattern) -> bool:
    assert _hs is not None
    try:
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        db.compile(expressions=[p.prefilter], ids=[0], flags=[_flags(p)])
    except _hs.error:
        return False
    return True


def make_engine(patterns: Sequence[_Pattern], engine: str = "auto") -> _ReEngine | _HyperscanEngine:
    """The fastest engine available, or the one asked for ("hyperscan" or "re")."""
    if engine == "re" or (engine == "auto" and _hs is None):
        return _ReEngine(patterns)
    if _hs is None:
        raise RuntimeError("engine='hyperscan' asked for, but hyperscan cannot be imported")
    return _HyperscanEngine(patterns)


def blocks(source: LogSource) -> Iterator[bytes]:
    """Yield the log in blocks that end on a line break (bar the last), in bounded memory."""
    if source is None:
        return
    if isinstance(source, str):
        source = source.encode("utf-8", "surrogateescape")
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield from _split(io.BytesIO(bytes(source)))
        return
    if isinstance(source, os.PathLike):
        with open(source, "rb") as fh:
            yield from _split(fh)
        return
    yield from _split(source)


def _split(fh: BinaryIO | io.BytesIO) -> Iterator[bytes]:
    carry = b""
    while True:
        chunk = fh.read(BLOCK_BYTES)
        if not chunk:
            break
        data = carry + chunk if carry else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) > MAX_LINE_BYTES:
            cut = len(data)  # a line longer than any real one: cut it rather than grow
        if cut:
            yield data[:cut]
        carry = data[cut:]
    if carry:
        yield carry


class _Collector:
    """Turns raw engine reports into verified, bounded hits; one instance per scan."""

    def __init__(self, rules: RuleSet, patterns: Sequence[_Pattern], active: set[int]) -> None:
        self.rules = rules.rules
        self.warning = rules.warning_line
        self.patterns = patterns
        self.active = active
        self.hits: dict[tuple[int, int | None], Hit] = {}
        self.context_seen: dict[int, deque[int]] = {}
        self.pending: dict[int, list[Hit]] = {}
        self.base = 0
        self._start_block(b"")

    def _start_block(self, block: bytes) -> None:
        self.block = block
        self.pos = 0
        self.line_no = self.base
        self.seen: dict[int, int] = {}
        self.cache: tuple[int, Line] | None = None

    def feed(self, pid: int, end: int) -> None:
        p = self.patterns[pid]
        if p.rule not in self.active:
            return
        block = self.block
        at = max(end - 1, 0)
        start = block.rfind(b"\n", 0, at) + 1
        if self.seen.get(pid) == start:
            return
        self.seen[pid] = start
        if start >= self.pos:
            self.line_no += block.count(b"\n", self.pos, start)
            self.pos = start
            line_no = self.line_no
        else:  # an engine may report out of order; recount rather than guess
            line_no = self.base + block.count(b"\n", 0, start)
        line = self._line(start, at)
        if p.regex.search(line.text) is None:
            return
        if p.is_context:
            self._context_hit(p.rule, line_no + 1)
            return
        rule = self.rules[p.rule]
        if any(r.search(line.text) for r in rule.log_not_res):
            return
        if not rule.warnings and self.warning.search(line.text):
            return
        hit = Hit(p.rule, line_no + 1, line)
        if rule.context_res:
            self._needs_context(rule, hit)
        else:
            self._add(hit)

    def _line(self, start: int, at: int) -> Line:
        if self.cache is not None and self.cache[0] == start:
            return self.cache[1]
        stop = self.block.find(b"\n", at)
        stop = len(self.block) if stop < 0 else stop
        line = read_line(self.block[start:min(stop, start + MAX_LINE_BYTES)])
        self.cache = (start, line)
        return line

    def _add(self, hit: Hit) -> None:
        key = (hit.rule, hit.line.rank)
        if key not in self.hits and len(self.hits) < MAX_HITS:
            self.hits[key] = hit

    def _needs_context(self, rule: Rule, hit: Hit) -> None:
        seen = self.context_seen.get(hit.rule, ())
        if any(hit.line_number - n <= rule.context_lines for n in seen):
            self._add(hit)
            return
        waiting = self.pending.setdefault(hit.rule, [])
        if len(waiting) < MAX_PENDING:
            waiting.append(hit)

    def _context_hit(self, rule_index: int, line_number: int) -> None:
        self.context_seen.setdefault(rule_index, deque(maxlen=8)).append(line_number)
        waiting = self.pending.get(rule_index)
        if not waiting:
            return
        window = self.rules[rule_index].context_lines
        for hit in [h for h in waiting if line_number - h.line_number <= window]:
            self._add(hit)
        self.pending[rule_index] = []

    def scan(self, engine: _ReEngine | _HyperscanEngine, source: LogSource) -> ScanResult:
        last: tuple[bytes, int] | None = None
        for block in blocks(source):
            self._start_block(block)
            engine.scan(block, self.feed)
            newlines = block.count(b"\n")
            body = block.rstrip()
            if body:
                idx = body.rfind(b"\n") + 1
                tail = body[idx:idx + MAX_LINE_BYTES]
                last = (tail, self.base + newlines - block.count(b"\n", idx) + 1)
            self.base += newlines
        hits = sorted(self.hits.values(), key=lambda h: (h.line_number, h.rule))
        if last is None:
            return ScanResult(tuple(hits), None, None)
        return ScanResult(tuple(hits), read_line(last[0]), last[1])


class Scanner:
    """A rule set's patterns compiled once into one engine, reusable across logs."""

    def __init__(self, rules: RuleSet, engine: str = "auto") -> None:
        self.rules = rules
        self.patterns = patterns_of(rules.rules)
        self.engine = make_engine(self.patterns, engine)
        self.engine_name = type(self.engine).__name__.strip("_").replace("Engine", "").lower()

    def scan(self, source: LogSource, active: set[int] | None = None) -> ScanResult:
        """Scan one log; ``active`` limits which rules may match (all with log patterns)."""
        if active is None:
            active = {i for i, r in enumerate(self.rules.rules) if r.log_res}
        return _Collector(self.rules, self.patterns, active).scan(self.engine, source)
