"""Digit-blind regexes: whose answer cannot change when every digit of a line reads as 0.

The scan remembers a rejected line by its digit-masked shape; that is sound only for the
regexes this module says are blind, because two lines of one shape differ only in digits.
``RuleChecks`` holds, per rule, the regexes that veto a candidate line, with their blind parts.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from re import _parser as _sre  # type: ignore[attr-defined]  # stdlib regex parser, 3.11+

from trainguard.core.triage.lines import SOURCE
from trainguard.core.triage.rules import STRENGTHS, RuleSet


@lru_cache(maxsize=1024)
def digit_blind(pattern: str, flags: int = 0) -> bool:
    """Whether the regex cannot tell one digit from another, so masking digits keeps its answer."""
    try:
        return _blind(list(_sre.parse(pattern, flags)))
    except (re.error, RecursionError, ValueError):
        return False


def blind_parts(regex: re.Pattern[str]) -> list[re.Pattern[str]]:
    """The top-level alternatives of the regex that are digit-blind, compiled on their own.

    When one of them matches a line, every line of the same digit-masked shape matches the
    regex too: that is what lets a rejection by ``'c10d|NCCL|...'`` be remembered by shape.
    """
    if digit_blind(regex.pattern, regex.flags):
        return [regex]
    out = []
    for part in _alternatives(regex.pattern):
        try:
            compiled = re.compile(part, regex.flags)
        except re.error:
            continue
        if digit_blind(compiled.pattern, compiled.flags):
            out.append(compiled)
    return out


def _alternatives(pattern: str) -> list[str]:
    """Split a regex at its top-level ``|`` (outside groups and character classes)."""
    parts, depth, in_class, escaped, start = [], 0, False, False, 0
    for i, ch in enumerate(pattern):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]" or pattern[i - 1] == "["
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
    parts.append(pattern[start:])
    return parts


def _blind(items: list[Any]) -> bool:
    for op, av in items:
        if op in (_sre.LITERAL, _sre.NOT_LITERAL) and 0x30 <= av <= 0x39:
            return False
        if op is _sre.RANGE and not (av[1] < 0x30 or av[0] > 0x39 or av[0] <= 0x30 <= 0x39 <= av[1]):
            return False
        if op in (_sre.GROUPREF, _sre.GROUPREF_EXISTS):
            return False
        if op is _sre.IN and not _blind(list(av)):
            return False
        if op is _sre.BRANCH and not all(_blind(list(b)) for b in av[1]):
            return False
        if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT) and not _blind(list(av[2])):
            return False
        if op in (_sre.SUBPATTERN, _sre.ATOMIC_GROUP, _sre.ASSERT, _sre.ASSERT_NOT):
            if not _blind(list(av[-1])):
                return False
    return True


@lru_cache(maxsize=1024)
def widened(pattern: str, flags: int = 0) -> re.Pattern[str] | None:
    """The regex with every digit it names widened to any digit, so digit-blind; None if unsure.

    It matches whatever the regex matches, so when it rejects a line, the regex rejects every
    line of the same digit-masked shape: "s3 ... timed out" rejects a wandb retry line for good.
    """
    out: list[str] = []
    i, in_class, class_digits, negated = 0, False, False, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1:i + 2]
            if nxt.isdigit() or nxt in ("x", "u", "U", "N", "o"):
                return None  # back-references and code points: not worth reading
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if ch == "]" and pattern[i - 1] != "[" and pattern[i - 2:i] != "[^":
                in_class = False
                if class_digits and negated:
                    return None  # widening what a negated class refuses narrows it
                out.append("0-9]" if class_digits else "]")
            else:
                class_digits |= ch.isdigit()
                out.append(ch)
        elif ch == "[":
            in_class, class_digits = True, False
            negated = pattern[i + 1:i + 2] == "^"
            out.append(ch)
        elif ch == "{":
            end = pattern.find("}", i)
            if end < 0:
                return None
            out.append(pattern[i:end + 1])  # a repeat count, not text
            i = end + 1
            continue
        else:
            out.append("[0-9]" if ch.isdigit() else ch)
        i += 1
    try:
        compiled = re.compile("".join(out), flags)
    except re.error:
        return None
    return compiled if digit_blind(compiled.pattern, compiled.flags) else None


class RuleChecks:
    """What the collector needs of each rule, worked out once per scanner (lazily: most rules
    never see a candidate line, and parsing regexes costs more than a quiet log's scan)."""

    def __init__(self, ruleset: RuleSet, saturation: int, hint_saturation: int) -> None:
        self.rules = ruleset.rules
        self.warning_line = ruleset.warning_line
        # Confirmed lines after which a rule is not looked at again: later ones cannot win.
        self.limits = [hint_saturation if r.strength <= STRENGTHS["hint"] else saturation
                       for r in ruleset.rules]
        self.window = max((r.context_lines for r in ruleset.rules if r.context or r.context_not), default=0)
        self._rejectors: dict[int, list[tuple[re.Pattern[str], list[re.Pattern[str]]]]] = {}

    def rejectors(self, index: int) -> list[tuple[re.Pattern[str], list[re.Pattern[str]]]]:
        """The regexes that veto a candidate line of the rule, each with its digit-blind parts."""
        found = self._rejectors.get(index)
        if found is None:
            rule = self.rules[index]
            own = [SOURCE, *rule.log_not_res] + ([] if rule.warnings else [self.warning_line])
            found = self._rejectors[index] = [(r, blind_parts(r)) for r in own]
        return found
