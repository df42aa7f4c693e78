"""Literals a regex's every match must contain, read from the parsed pattern.

The pure-``re`` engine and ``LineFinder`` search for these with ``bytes.find`` (memchr speed) and
run the regex only on the lines holding one. ``loosened`` drops, from a pattern used only to find
candidate lines, the parts that name a word every training progress line prints.
"""

from __future__ import annotations

import re
from typing import Any

from re import _parser as _sre  # type: ignore[attr-defined]  # stdlib regex parser, 3.11+

MIN_LITERAL = 3
MAX_EXPANSION = 64
# Words every progress line of a training loop prints ("iter 120 | lm loss: 2.41 | grad norm: ...").
# A candidate-line pattern that must see one of them as well as a rarer part costs a multi-pattern
# engine a check on every line of a healthy log, and filters nothing the rarer part does not.
PROGRESS_WORDS = frozenset({b"loss", b"lr", b"step", b"epoch", b"iter", b"iteration",
                            b"grad_norm", b"grad norm", b"tokens"})
# Words healthy runs print in routine lines, over and over: every checkpoint save, and the warning
# of every retried request ("Network error", "failed to connect"). A candidate-line part naming
# only these finds those lines as often as the words do, while a rarer part finds the same
# failures without them.
ROUTINE_WORDS = frozenset({b"checkpoint", b"error", b"fail", b"failed", b"failure", b"unable",
                           b"cannot", b"can"})  # "can" is what "can.t" leaves as a literal
_FLAGS = re.compile(r"^\(\?[aiLmsux]+\)")
_ANY_RUN = ".*"
_ANY_WORD = "\\S*"


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


def loosened(pattern: str) -> str:
    """A pattern matching every line ``pattern`` matches, without its routine words.

    Each top-level alternative that is parts joined by ``.*`` or ``\\S*`` keeps only the parts
    none of whose required literals is a word of ``PROGRESS_WORDS`` and not all of whose are
    words of ``ROUTINE_WORDS``, joined by ``.*``, as long as a part with literals remains:
    ``nan.*loss`` becomes ``nan``, ``error.*restoring.*checkpoint`` becomes ``restoring``.
    Whatever else the pattern is, it is returned unchanged.
    """
    if _ANY_RUN not in pattern and _ANY_WORD not in pattern:  # most: nothing to leave out
        return pattern
    flags = _FLAGS.match(pattern)
    head = flags.group(0) if flags else ""
    branches = []
    for branch in _top_level(pattern[len(head):], "|"):
        parts = [q for p in _top_level(branch, _ANY_RUN) for q in _top_level(p, _ANY_WORD)]
        kept = [p for p in parts if len(parts) == 1 or not _routine(head + p)]
        if len(kept) < len(parts) and kept and any(required_literals(head + p) for p in kept):
            branch = _ANY_RUN.join(kept)
        branches.append(branch)
    out = head + "|".join(branches)
    if out == pattern:
        return pattern
    try:
        re.compile(out)
    except re.error:
        return pattern
    return out


def _routine(part: str) -> bool:
    literals = required_literals(part)
    if literals is None:
        return False
    lowered = [lit.lower() for lit in literals]
    return (any(lit in PROGRESS_WORDS for lit in lowered)
            or all(lit in ROUTINE_WORDS for lit in lowered))


def _top_level(pattern: str, separator: str) -> list[str]:
    """Split at ``separator`` where it stands outside groups, classes and escapes."""
    parts, depth, in_class, i, start = [], 0, False, 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if depth == 0 and not in_class and pattern.startswith(separator, i):
            parts.append(pattern[start:i])
            i = start = i + len(separator)
            continue
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]" or pattern[i - 1] == "["
        elif ch == "[":
            in_class = True
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        i += 1
    parts.append(pattern[start:])
    return parts
