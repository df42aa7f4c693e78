"""Streaming the log once through every rule's patterns, in bounded memory and bounded work.

The log is read in blocks that end on a line break, and each block in line-aligned chunks; one
multi-pattern engine (``engines``), a block ahead on a second thread (``pipeline``), says which
patterns occur in each chunk, once each however often. Only then are the lines of those patterns
found, decoded, stripped of prefixes (``lines``) and checked with the rule's own regex, so the
cost of a long log grows neither with the number of rules nor with the lines that match:

- a rule that already has ``SATURATION`` confirmed lines (``HINT_SATURATION`` for hint-strength
  rules) is not looked at again: its earliest lines are known, later ones cannot win;
- a chunk's lines are looked at by their distinct digit-masked shapes: a line a rule rejects (a
  warning, a quoted source line, its ``log_not``, a near miss of its regex) is remembered by its
  shape, so the next checkpoint save or retry warning of that shape costs one set look-up. A
  rejection is remembered only where it holds for every digit (``shapes``): by a digit-blind
  regex, or when the rule's regex widened to any digit rejects the line too;
- ``context`` patterns are not scanned for: they are checked only in the window of lines
  around a candidate line, from the block in hand and a ring buffer of the previous block's last
  lines.

What is kept is bounded: the first match of each rule on each rank, the last non-empty line for
the fallback verdict, and the last ``TAIL_BYTES`` of whole lines (torchrun's failure report).
"""

from __future__ import annotations

import io
import os
import re
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from trainguard_entrypoint import safefiles

from trainguard.core.triage.engines import (
    Finders, HyperscanEngine, Pattern, ReEngine, candidate_source, hyperscan_available, make_engine,
)
from trainguard.core.triage.lines import Line, read_line
from trainguard.core.triage.lineshapes import MASK
from trainguard.core.triage.noisy import LiteralLines, Shapes, lines_of, shape_at
from trainguard.core.triage.pipeline import Answer, Block, Tail, ahead, chunks
from trainguard.core.triage.shapes import RuleChecks, widened
from trainguard.core.triage.rules import Rule, RuleSet
from trainguard.core.triage.signals import LogSource

__all__ = ["Hit", "ScanResult", "Scanner", "blocks", "hyperscan_available", "patterns_of"]

BLOCK_BYTES = 4 << 20
MAX_LINE_BYTES = 64 << 10
MAX_HITS = 4096
MAX_PENDING = 16
SATURATION = 64
HINT_SATURATION = 8
MAX_REMEMBERED = 1 << 14
MAX_REMEMBERED_SHAPE = 4 << 10
TAIL_BYTES = 256 << 10
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
    tail: tuple[bytes, ...] = ()  # the log's last whole lines, raw
    tail_start: int = 1  # the line number of tail[0]


def patterns_of(rules: Sequence[Rule]) -> list[Pattern]:
    """Every log pattern of the rules, in one flat table (context patterns are not scanned for)."""
    out: list[Pattern] = []
    for index, rule in enumerate(rules):
        for source in rule.log:
            out.append(Pattern(index, source, False, candidate_source(source), rule.ignore_case))
    return out


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
        try:  # the job's log: a regular file, never a FIFO to wait on or a link to follow
            fh = safefiles.open_regular(source)
        except safefiles.Refused:
            return  # nothing to read; the other signals decide
        with fh:
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


@dataclass
class _Waiting:
    """A candidate line whose context window runs past the end of its block."""

    hit: Hit
    lines_left: int


class _Collector:
    """Turns engine reports into verified, bounded hits; one instance per scan."""

    def __init__(self, info: RuleChecks, patterns: Sequence[Pattern], finders: Finders,
                 active: set[int], noisy: LiteralLines | None = None) -> None:
        self.info = info
        self.noisy = noisy
        self.patterns = patterns
        self.finders = finders
        self.active = active
        self.hits: dict[tuple[int, int | None], Hit] = {}
        self.confirmed = [0] * len(info.rules)
        self.done: set[int] = set()  # saturated rules
        self.rejected: set[tuple[int, bytes]] = set()  # (pattern, masked line) known to fail
        self.lacking: set[tuple[int, bytes]] = set()  # (pattern, masked line) without its literals
        self.fresh: list[bytes] = []  # the chunk's noisy shapes not yet judged
        self.waiting: list[_Waiting] = []
        self.tail: deque[bytes] = deque(maxlen=max(info.window, 1))
        self.base = 0
        self.newlines: int | None = None  # of the chunk in hand, once it is split into lines

    def block(self, engine: ReEngine | HyperscanEngine, buf: bytes, start: int, stop: int,
              answer: Answer | None = None) -> None:
        """Scan one block of whole lines; ``answer`` is the engine's, if already had."""
        found: list[tuple[int, int, Line]] = []
        parts = chunks(buf, start, stop)
        present = answer if answer is not None else engine.present(buf, parts)
        newlines = 0
        for (a, b), pids in zip(parts, present, strict=True):
            self.newlines = None
            found.extend(self._chunk(engine, buf, start, a, b, pids))
            # A chunk split into lines has had them counted; counting again costs a pass.
            newlines += buf.count(b"\n", a, b) if self.newlines is None else self.newlines
            for rule in {r for _, r, _ in found}:
                if self.confirmed[rule] >= self.info.limits[rule]:
                    self.done.add(rule)
        self._settle_waiting(buf, start, stop)
        found.sort(key=lambda f: (f[0], f[1]))
        line_no, pos = self.base, start
        for offset, rule, line in found:
            line_no += buf.count(b"\n", pos, offset)
            pos = offset
            hit = Hit(rule, line_no + 1, line)
            if not self.info.rules[rule].context:
                self._add(hit)
            elif (rule, line.rank) not in self.hits:
                self._with_context(hit, buf, start, stop, offset)
        self._remember_tail(buf, start, stop)
        self.base += newlines

    def _chunk(self, engine: ReEngine | HyperscanEngine, buf: bytes, start: int, a: int, b: int,
               pids: list[int]) -> list[tuple[int, int, Line]]:
        todo = [pid for pid in pids
                if self.patterns[pid].rule in self.active and self.patterns[pid].rule not in self.done]
        if not todo:
            return []
        out: list[tuple[int, int, Line]] = []
        seen: set[tuple[int, int]] = set()
        for pid, lines in self._candidates(engine, buf, a, b, todo):
            rule = self.patterns[pid].rule
            for line_start, shape in lines:
                if (pid, shape) in self.rejected or (rule, line_start) in seen:
                    continue
                # A line one of a rule's patterns rejects may still be accepted by another.
                line = self._confirm(pid, buf, line_start, line_start + len(shape), shape)
                if line is not None:
                    seen.add((rule, line_start))
                    if self._vetoed(rule, buf, start, line_start):
                        continue  # not the rule's line here, so it does not count toward its saturation
                    out.append((line_start, rule, line))
                    self.confirmed[rule] += 1
        if self.fresh:
            self._judge()
        return out

    def _judge(self) -> None:
        """Remember the chunk's noisy shapes now known to fail or to lack the literals of every
        noisy pattern whose rule may still match: no line of such a shape can become a hit."""
        assert self.noisy is not None
        fresh, self.fresh = self.fresh, []
        live = [pid for pid in self.noisy.pids
                if self.patterns[pid].rule in self.active and self.patterns[pid].rule not in self.done]
        rejected, lacking, judged = self.rejected, self.lacking, self.noisy.judged
        for shape in fresh:
            if all((pid, shape) in rejected or (pid, shape) in lacking for pid in live):
                if len(judged) >= MAX_REMEMBERED:
                    judged.clear()
                judged.add(shape)

    def _candidates(self, engine: ReEngine | HyperscanEngine, buf: bytes, a: int, b: int,
                    pids: list[int]) -> Iterator[tuple[int, list[tuple[int, bytes]]]]:
        """For each pattern, the (start, digit-masked text) of the lines it may match.

        Each of the chunk's distinct digit-masked lines is searched once for a pattern's
        literals, ever: a shape known to fail or to lack them costs a set look-up, and only the
        others are looked up among the real lines, so a thousand checkpoint saves of one shape
        cost one rejected shape. A pattern without a literal has its lines found by its regex.
        """
        got: tuple[bytes, Collection[bytes], Shapes | None] | None = None
        for pid in pids:
            finder = self.finders[pid]
            if finder.masked is None:
                lowered_chunk = buf[a:b].lower() if finder.caseless else None
                yield pid, [(s, shape_at(buf, s, b))
                            for s, _ in finder.candidates(buf, a, b, lowered_chunk)]
                continue
            if got is None:
                got = self._shapes(buf, a, b, pids)
            masked, shapes, by_shape = got
            found = [shape for shape in shapes if (pid, shape) not in self.rejected
                     and (pid, shape) not in self.lacking and self._holds(pid, shape)]
            yield pid, [(s, shape) for shape in found for s in (
                by_shape[shape] if by_shape is not None else lines_of(masked, shape, a))]

    def _shapes(self, buf: bytes, a: int, b: int,
                pids: list[int]) -> tuple[bytes, Collection[bytes], Shapes | None]:
        """The chunk's distinct digit-masked lines: only those holding a literal of the noisy
        patterns when the engine can say which, else all of them, with the masked chunk."""
        if self.noisy is not None:
            by_shape = self.noisy.shapes(
                buf, a, b, [pid for pid in pids if self.finders[pid].masked is not None])
            if by_shape is not None:
                judged = self.noisy.judged  # a repeated save or warning costs one look-up
                self.fresh = [shape for shape in by_shape.keys() if shape not in judged]
                return b"", self.fresh, by_shape
        masked = buf[a:b].translate(MASK)
        lines = masked.split(b"\n")
        self.newlines = len(lines) - 1
        return masked, set(lines), None

    def _holds(self, pid: int, shape: bytes) -> bool:
        """Whether the digit-masked line holds one of the pattern's literals; remembered if not."""
        finder = self.finders[pid]
        if finder.shapes(shape, shape.lower() if finder.caseless else None):
            return True
        if len(shape) <= MAX_REMEMBERED_SHAPE:
            if len(self.lacking) >= MAX_REMEMBERED:
                self.lacking.clear()
            self.lacking.add((pid, shape))
        return False

    def _confirm(self, pid: int, buf: bytes, start: int, end: int, shape: bytes) -> Line | None:
        """The read line if the pattern's rule accepts it; else remember the shape if it may."""
        p = self.patterns[pid]
        line = read_line(buf[start:min(end, start + MAX_LINE_BYTES)])
        text = line.text
        # Vetoes first: a veto by a digit-blind regex holds for every line of this shape.
        for regex, parts in self.info.rejectors(p.rule):
            if regex.search(text):
                if any(part.search(text) for part in parts):
                    self._remember((pid, shape))
                return None
        if p.regex.search(text) is None:
            # The widened regex matches every line the rule's would, whatever its digits.
            wide = widened(p.regex.pattern, p.regex.flags)
            if wide is not None and (wide.pattern == p.regex.pattern or wide.search(text) is None):
                self._remember((pid, shape))
            return None
        return line

    def _remember(self, key: tuple[int, bytes]) -> None:
        if len(self.rejected) >= MAX_REMEMBERED:
            self.rejected.clear()
        self.rejected.add(key)

    def _add(self, hit: Hit) -> None:
        key = (hit.rule, hit.line.rank)
        if key not in self.hits and len(self.hits) < MAX_HITS:
            self.hits[key] = hit

    def _with_context(self, hit: Hit, buf: bytes, start: int, stop: int, offset: int) -> None:
        rule = self.info.rules[hit.rule]
        window = rule.context_lines
        before = self._before(buf, start, offset, window)
        after: list[bytes] = []
        pos = offset
        while len(after) <= window and pos < stop:
            end = buf.find(b"\n", pos, stop)
            end = stop if end < 0 else end
            after.append(buf[pos:end])
            pos = end + 1
        if self._context_in(rule, before + after):
            self._add(hit)
        elif len(after) <= window and len(self.waiting) < MAX_PENDING * 4:
            self.waiting.append(_Waiting(hit, window + 1 - len(after)))

    def _settle_waiting(self, buf: bytes, start: int, stop: int) -> None:
        waiting, self.waiting = self.waiting, []
        for w in waiting:
            lines: list[bytes] = []
            pos = start
            while len(lines) < w.lines_left and pos < stop:
                end = buf.find(b"\n", pos, stop)
                end = stop if end < 0 else end
                lines.append(buf[pos:end])
                pos = end + 1
            if self._context_in(self.info.rules[w.hit.rule], lines):
                self._add(w.hit)

    def _before(self, buf: bytes, start: int, offset: int, window: int) -> list[bytes]:
        """Up to ``window`` lines before the one at ``offset``, nearest first (from the previous block's tail too)."""
        before: list[bytes] = []
        pos = offset
        while len(before) < window and pos > start:
            prev = buf.rfind(b"\n", start, pos - 1) + 1 or start
            before.append(buf[prev:pos - 1])
            pos = prev
        if len(before) < window:
            before.extend(reversed(list(self.tail)[-(window - len(before)):] if window else []))
        return before

    def _vetoed(self, rule: int, buf: bytes, start: int, offset: int) -> bool:
        """Whether the rule's ``context_not`` finds a line it names before the one at ``offset``."""
        vetoes = self.info.rules[rule].context_not_res
        return bool(vetoes) and self._any_in(vetoes, self._before(buf, start, offset, self.info.rules[rule].context_lines))

    @staticmethod
    def _context_in(rule: Rule, raw_lines: list[bytes]) -> bool:
        return _Collector._any_in(rule.context_res, raw_lines)

    @staticmethod
    def _any_in(patterns: tuple[re.Pattern[str], ...], raw_lines: list[bytes]) -> bool:
        for raw in raw_lines:
            text = read_line(raw[:MAX_LINE_BYTES]).text
            if any(r.search(text) for r in patterns):
                return True
        return False

    def _remember_tail(self, buf: bytes, start: int, stop: int) -> None:
        if not self.info.window:
            return
        lines: list[bytes] = []
        pos = stop
        while len(lines) < self.info.window and pos > start:
            prev = buf.rfind(b"\n", start, pos - 1) + 1 or start
            lines.append(buf[prev:min(pos - 1, prev + MAX_LINE_BYTES)])
            pos = prev
        if len(lines) >= self.info.window:
            self.tail.clear()
        self.tail.extend(reversed(lines))

    def scan(self, engine: ReEngine | HyperscanEngine, source: LogSource) -> ScanResult:
        last: tuple[bytes, int] | None = None
        without = self.noisy.database if self.noisy is not None else lambda: None
        tail = Tail(TAIL_BYTES)
        for buf, start, stop, answer in ahead(engine, blocks(source), without):
            self.block(engine, buf, start, stop, answer)
            tail.add(buf, start, stop)
            end = stop
            while end > start and buf[end - 1] in _BLANK:
                end -= 1
            if end > start:
                idx = buf.rfind(b"\n", start, end) + 1 or start
                number = self.base - buf.count(b"\n", idx, stop) + 1
                last = (buf[idx:min(end, idx + MAX_LINE_BYTES)], number)
        hits = tuple(sorted(self.hits.values(), key=lambda h: (h.line_number, h.rule)))
        lines, first = tail.lines(self.base)
        if last is None:
            return ScanResult(hits, None, None, lines, first)
        return ScanResult(hits, read_line(last[0]), last[1], lines, first)


class Scanner:
    """A rule set's patterns compiled once into one engine, reusable across logs."""

    def __init__(self, rules: RuleSet, engine: str = "auto") -> None:
        self.rules = rules
        self.patterns = patterns_of(rules.rules)
        self.finders = Finders(self.patterns)
        self.info = RuleChecks(rules, SATURATION, HINT_SATURATION)
        self.engine = make_engine(self.patterns, engine)
        self.engine_name = "hyperscan" if isinstance(self.engine, HyperscanEngine) else "re"

    def scan(self, source: LogSource, active: set[int] | None = None) -> ScanResult:
        """Scan one log; ``active`` limits which rules may match (all with log patterns)."""
        if active is None:
            active = {i for i, r in enumerate(self.rules.rules) if r.log}
        noisy = (LiteralLines(self.finders, self.engine)
                 if isinstance(self.engine, HyperscanEngine) else None)
        return _Collector(self.info, self.patterns, self.finders, active, noisy).scan(
            self.engine, source)
