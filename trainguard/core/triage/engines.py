"""Multi-pattern engines: find, in one block of log bytes, the lines any rule pattern may match.

Two engines give the same answers: Hyperscan (one compiled database, one pass, cached on disk
because compiling costs more than the rest of ``trainguard classify``) and pure ``re`` for
machines where Hyperscan cannot be imported. The ``re`` engine looks for a literal every match
must contain (found from the parsed pattern) with ``bytes.find`` and runs the regex only on the
lines holding it. Engines report (pattern id, absolute end offset); confirming a report against
the stripped line is ``scan``'s business.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from re import _parser as _sre  # type: ignore[attr-defined]  # stdlib regex parser, 3.11+

_hs: Any
try:  # Hyperscan is an optional accelerator; the pure-re engine gives the same answers.
    import hyperscan as _hs
except ImportError:  # pragma: no cover - exercised by forcing engine="re" in tests
    _hs = None

Feed = Callable[[int, int], None]
_BOUNDED_ANY = re.compile(r"(?<!\\)\.\{\d*,\d+\}")
MIN_LITERAL = 3
MAX_BUFFERED = 1 << 16
MAX_EXPANSION = 64


@dataclass(frozen=True)
class Pattern:
    """One rule pattern as the engines see it."""

    rule: int
    regex: re.Pattern[str]
    is_context: bool
    prefilter: bytes
    caseless: bool


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


class ReEngine:
    """Pure-``re`` engine: literal search with ``bytes.find``, the regex only on candidate lines."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self._plans: list[tuple[int, re.Pattern[bytes], list[bytes] | None, bool]] = []
        for pid, p in enumerate(patterns):
            caseless = p.caseless or "(?i" in p.regex.pattern
            flags = re.MULTILINE | (re.IGNORECASE if p.caseless else 0)
            literals = required_literals(p.prefilter.decode("utf-8"))
            if literals and caseless:
                literals = [lit.lower() for lit in literals]
            self._plans.append((pid, re.compile(p.prefilter, flags), literals, caseless))
        self._any_caseless = any(plan[3] and plan[2] for plan in self._plans)

    def scan(self, buf: bytes, start: int, stop: int, feed: Feed) -> None:
        found: list[tuple[int, int]] = []
        lowered = buf[start:stop].lower() if self._any_caseless else b""
        for pid, regex, literals, caseless in self._plans:
            if literals is None:
                found.extend((max(m.end(), m.start() + 1), pid)
                             for m in regex.finditer(buf, start, stop))
                continue
            hay, base = (lowered, start) if caseless else (buf, 0)
            for lit in literals:
                pos = start - base
                while (i := hay.find(lit, pos, stop - base)) >= 0:
                    line_start = buf.rfind(b"\n", start, i + base) + 1 or start
                    line_end = buf.find(b"\n", i + base, stop)
                    line_end = stop if line_end < 0 else line_end
                    m = regex.search(buf, line_start, line_end)
                    if m is not None:
                        found.append((max(m.end(), m.start() + 1), pid))
                    pos = line_end + 1 - base
        found.sort()
        for end, pid in found:
            feed(pid, end)


def required_literals(pattern: str) -> list[bytes] | None:
    """Literals of which every match contains one, or None when no useful set exists."""
    try:
        parsed = _sre.parse(pattern)
    except (re.error, RecursionError, ValueError):
        return None
    best = _sequence(list(parsed))
    if not best or min(len(x) for x in best) < MIN_LITERAL:
        return None
    return [x.encode("utf-8") for x in best]


def _sequence(items: list[Any]) -> list[str] | None:
    """The best literal set of a sequence: runs of exactly-known text, or one item's own set."""
    candidates: list[list[str]] = []
    run = [""]
    for op, av in items:
        exact = _exact(op, av)
        if exact is not None and len(run) * len(exact) <= MAX_EXPANSION:
            run = [a + b for a in run for b in exact]
            continue
        if any(run):
            candidates.append(run)
        run = [""]
        sub = _item(op, av)
        if sub:
            candidates.append(sub)
    if any(run):
        candidates.append(run)
    if not candidates:
        return None
    return max(candidates, key=lambda c: min(len(x) for x in c))


def _exact(op: Any, av: Any) -> list[str] | None:
    """Every string one item can match, when that is a short finite list."""
    if op is _sre.LITERAL:
        return [chr(av)]
    if op is _sre.IN and all(o is _sre.LITERAL for o, _ in av) and len(av) <= 8:
        return [chr(v) for _, v in av]
    if op is _sre.MAX_REPEAT and av[0] == 0 and av[1] == 1:  # optional: "" or the item
        inner = _exact_sequence(list(av[2]))
        return [""] + inner if inner is not None and len(inner) < MAX_EXPANSION else None
    if op is _sre.SUBPATTERN or op is _sre.BRANCH:
        branches = [list(av[-1])] if op is _sre.SUBPATTERN else [list(b) for b in av[1]]
        out: list[str] = []
        for branch in branches:
            strings = _exact_sequence(branch)
            if strings is None:
                return None
            out.extend(strings)
        return out if len(out) <= MAX_EXPANSION else None
    return None


def _exact_sequence(items: list[Any]) -> list[str] | None:
    strings = [""]
    for op, av in items:
        part = _exact(op, av)
        if part is None or len(strings) * len(part) > MAX_EXPANSION:
            return None
        strings = [a + b for a in strings for b in part]
    return strings


def _item(op: Any, av: Any) -> list[str] | None:
    if op is _sre.SUBPATTERN:
        return _sequence(list(av[-1]))
    if op is _sre.BRANCH:
        alternatives = [_sequence(list(branch)) for branch in av[1]]
        if all(alternatives):
            return [x for alt in alternatives if alt for x in alt]
        return None
    if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT) and av[0] >= 1:
        return _sequence(list(av[2]))
    return None


class HyperscanEngine:
    """Hyperscan block mode over line-aligned blocks; patterns it refuses fall to ``re``."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        assert _hs is not None
        ok = list(range(len(patterns)))
        self._db = _cached_database(patterns, ok)
        if self._db is None:
            ok = [i for i, p in enumerate(patterns) if _compiles(p)]
            self._db = _cached_database(patterns, ok) if ok else None
        accepted = set(ok)
        self._rest_ids = [i for i in range(len(patterns)) if i not in accepted]
        rest = [patterns[i] for i in self._rest_ids]
        self._rest = ReEngine(rest) if rest else None
        # Hyperscan scratch space is per scan in flight: one per thread (Prefect runs tasks on
        # threads), cloned from the database's own.
        self._local = threading.local()

    def _scratch(self) -> Any:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = _hs.Scratch(self._db)
        return scratch

    def scan(self, buf: bytes, start: int, stop: int, feed: Feed) -> None:
        if self._db is not None:
            # Reports are gathered and sorted so line numbers are counted in one forward pass;
            # past a bound they are fed as they come (the collector recounts when out of order).
            found: list[tuple[int, int]] = []

            def on_match(pid: int, _from: int, to: int, _flags: int, _ctx: Any) -> None:
                if len(found) < MAX_BUFFERED:
                    found.append((start + to, pid))
                else:
                    feed(pid, start + to)
            self._db.scan(memoryview(buf)[start:stop], match_event_handler=on_match,
                          scratch=self._scratch())
            found.sort()
            for end, pid in found:
                feed(pid, end)
        if self._rest is not None:
            ids = self._rest_ids
            self._rest.scan(buf, start, stop, lambda pid, end: feed(ids[pid], end))


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


def _flags(p: Pattern) -> int:
    assert _hs is not None
    flags = _hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_MULTILINE | _hs.HS_FLAG_ALLOWEMPTY
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


def _cached_database(patterns: Sequence[Pattern], ids: Sequence[int]) -> Any:
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
