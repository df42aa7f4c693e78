"""Streaming the log once through every rule's patterns, in bounded memory.

The log is read in blocks that end on a line break; one multi-pattern engine (``engines``) finds
the lines any pattern may match. Only those lines are decoded, stripped of prefixes (``lines``)
and checked with the rule's own regex, so the cost of a long log does not grow with the number of
rules. What is kept is bounded: the first match of each rule on each rank, plus the last
non-empty line for the fallback verdict.
"""

from __future__ import annotations

import io
import os
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from trainguard.core.triage.engines import (
    HyperscanEngine,
    Pattern,
    ReEngine,
    hyperscan_available,
    make_engine,
    prefilter_source,
)
from trainguard.core.triage.lines import Line, is_source, read_line
from trainguard.core.triage.rules import Rule, RuleSet
from trainguard.core.triage.signals import LogSource

__all__ = ["Hit", "ScanResult", "Scanner", "blocks", "hyperscan_available", "patterns_of"]

BLOCK_BYTES = 8 << 20
MAX_LINE_BYTES = 64 << 10
MAX_HITS = 4096
MAX_PENDING = 16
_BLANK = b" \t\r\n"


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


def patterns_of(rules: Sequence[Rule]) -> list[Pattern]:
    """Every log and context pattern of the rules, in one flat table."""
    out: list[Pattern] = []
    for index, rule in enumerate(rules):
        for regex in rule.log_res:
            out.append(Pattern(index, regex, False, prefilter_source(regex.pattern),
                               rule.ignore_case))
        for regex in rule.context_res:
            out.append(Pattern(index, regex, True, prefilter_source(regex.pattern),
                               rule.ignore_case))
    return out


Block = tuple[bytes, int, int]  # buffer, start, stop: the lines in buffer[start:stop]


def blocks(source: LogSource) -> Iterator[Block]:
    """Yield the log as line-aligned blocks, without copying the bulk of what is read."""
    if source is None:
        return
    if isinstance(source, str):
        source = source.encode("utf-8", "surrogateescape")
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield from _split(io.BytesIO(bytes(source)))
        return
    if isinstance(source, (os.PathLike, )):
        with open(source, "rb") as fh:
            yield from _split(fh)
        return
    yield from _split(source)


def _split(fh: BinaryIO | io.BytesIO) -> Iterator[Block]:
    carry = b""
    while chunk := fh.read(BLOCK_BYTES):
        first = chunk.find(b"\n") + 1
        if first == 0:  # no line ends in this chunk: keep collecting, within a bound
            carry += chunk
            if len(carry) > MAX_LINE_BYTES:
                yield carry, 0, len(carry)
                carry = b""
            continue
        if carry:  # only the carried line is copied, never the chunk
            head = carry + chunk[:first]
            yield head, 0, len(head)
        cut = chunk.rfind(b"\n") + 1
        if cut > first or not carry:
            yield chunk, 0 if not carry else first, cut
        carry = chunk[cut:]
    if carry:
        yield carry, 0, len(carry)


class _Collector:
    """Turns raw engine reports into verified, bounded hits; one instance per scan."""

    def __init__(self, rules: RuleSet, patterns: Sequence[Pattern], active: set[int]) -> None:
        self.rules = rules.rules
        self.warning = rules.warning_line
        self.patterns = patterns
        self.active = active
        self.hits: dict[tuple[int, int | None], Hit] = {}
        self.context_seen: dict[int, deque[int]] = {}
        self.pending: dict[int, list[Hit]] = {}
        self.base = 0
        self._start_block((b"", 0, 0))

    def _start_block(self, block: Block) -> None:
        self.buf, self.start, self.stop = block
        self.pos = self.start
        self.line_no = self.base
        self.seen: dict[int, int] = {}
        self.cache: tuple[int, Line] | None = None

    def feed(self, pid: int, end: int) -> None:
        p = self.patterns[pid]
        if p.rule not in self.active:
            return
        buf, at = self.buf, max(end - 1, self.start)
        start = buf.rfind(b"\n", self.start, at) + 1 or self.start
        if self.seen.get(pid) == start:
            return
        self.seen[pid] = start
        if start >= self.pos:
            self.line_no += buf.count(b"\n", self.pos, start)
            self.pos = start
            line_no = self.line_no
        else:  # an engine may report out of order; recount rather than guess
            line_no = self.base + buf.count(b"\n", self.start, start)
        line = self._line(start, at)
        if p.regex.search(line.text) is None:
            return
        if p.is_context:
            self._context_hit(p.rule, line_no + 1)
            return
        rule = self.rules[p.rule]
        if is_source(line.text) or any(r.search(line.text) for r in rule.log_not_res):
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
        stop = self.buf.find(b"\n", at, self.stop)
        stop = self.stop if stop < 0 else stop
        line = read_line(self.buf[start:min(stop, start + MAX_LINE_BYTES)])
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

    def scan(self, engine: ReEngine | HyperscanEngine, source: LogSource) -> ScanResult:
        last: tuple[bytes, int] | None = None
        for block in blocks(source):
            self._start_block(block)
            buf, start, stop = block
            engine.scan(buf, start, stop, self.feed)
            # Reports counted lines up to self.pos already; count only the rest of the block.
            newlines = self.line_no - self.base + buf.count(b"\n", self.pos, stop)
            end = stop
            while end > start and buf[end - 1] in _BLANK:
                end -= 1
            if end > start:
                idx = buf.rfind(b"\n", start, end) + 1 or start
                number = self.base + newlines - buf.count(b"\n", idx, stop) + 1
                last = (buf[idx:min(end, idx + MAX_LINE_BYTES)], number)
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
        self.engine_name = "hyperscan" if isinstance(self.engine, HyperscanEngine) else "re"

    def scan(self, source: LogSource, active: set[int] | None = None) -> ScanResult:
        """Scan one log; ``active`` limits which rules may match (all with log patterns)."""
        if active is None:
            active = {i for i, r in enumerate(self.rules.rules) if r.log_res}
        return _Collector(self.rules, self.patterns, active).scan(self.engine, source)
