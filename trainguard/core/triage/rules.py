"""Rules as data: loading, validating and layering the YAML rule files.

A rule names a category and the evidence that proves it: exit codes or signals, termination
reasons, pod conditions, events and log regexes. Every matcher kind a rule lists must hold (AND);
within one kind any entry may match (OR). ``strength`` ranks the evidence: a root cause
(``cause``) beats a consequence (``consequence``) wherever each appears in the log. ``victim``
marks evidence that a rank lost a peer (a closed connection, a collective timeout, its launcher's
closing signal): such a rank is never the root cause while another failure is in the evidence. A
victim rule's ``pid_group`` says which group of its patterns names the process whose loss it
reports.
``wrapper`` marks evidence that only wraps a cause reported beside it (an abort after an uncaught
C++ exception): it never outranks a victim's evidence. How the log is scanned belongs in
``scan``; how matches become a verdict belongs in ``decide``.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from trainguard.core.taxonomy import Category

# Higher wins. "verdict": the platform said what happened; "cause": a root-cause signature;
# "error": a generic error that is its own cause; "crash": a native crash with no clearer cause;
# "consequence": what other ranks or wrappers report after the cause; "hint": weak evidence;
# "guess": weaker still (where a cut-off traceback was), beaten by any hint.
STRENGTHS: dict[str, int] = {
    "verdict": 90, "cause": 70, "error": 50, "crash": 40, "consequence": 30, "hint": 10,
    "guess": 5,
}
_KEYS = {
    "id", "category", "strength", "retryable", "description", "log", "log_not", "context",
    "context_not", "context_lines", "warnings", "ignore_case", "exit_codes", "signals", "reasons",
    "conditions", "events", "disabled", "victim", "wrapper", "pid_group",
}
_ID = re.compile(r"^[a-z0-9_][a-z0-9_.-]*$")


class RuleFileError(ValueError):
    """A rule file that cannot be used; the message names the file, the line and the field."""


@dataclass(frozen=True)
class EventMatcher:
    reason: re.Pattern[str] | None
    message: re.Pattern[str] | None


@dataclass(frozen=True)
class ConditionMatcher:
    type: str
    reason: str | None
    status: str | None


@dataclass(frozen=True)
class Rule:
    """One rule, validated and compiled."""

    id: str
    category: Category
    strength: int
    retryable: bool | None = None
    description: str = ""
    log: tuple[str, ...] = ()
    log_not: tuple[str, ...] = ()
    context: tuple[str, ...] = ()
    context_not: tuple[str, ...] = ()  # vetoes a line when found in the `context_lines` before it
    context_lines: int = 40
    warnings: bool = False
    ignore_case: bool = False
    exit_codes: frozenset[int] = frozenset()
    reasons: frozenset[str] = frozenset()
    conditions: tuple[ConditionMatcher, ...] = ()
    events: tuple[EventMatcher, ...] = ()
    victim: bool = False
    wrapper: bool = False
    pid_group: int | None = None

    # Compiled on first use: a scan confirms lines for only the few rules it finds candidates
    # for, and compiling all of the shipped patterns costs most of a tenth of a second.
    @cached_property
    def log_res(self) -> tuple[re.Pattern[str], ...]:
        return self._compiled(self.log)

    @cached_property
    def log_not_res(self) -> tuple[re.Pattern[str], ...]:
        return self._compiled(self.log_not)

    @cached_property
    def context_res(self) -> tuple[re.Pattern[str], ...]:
        return self._compiled(self.context)

    @cached_property
    def context_not_res(self) -> tuple[re.Pattern[str], ...]:
        return self._compiled(self.context_not)

    def _compiled(self, patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p, re.IGNORECASE if self.ignore_case else 0) for p in patterns)

    @property
    def has_platform_matchers(self) -> bool:
        return bool(self.exit_codes or self.reasons or self.conditions or self.events)


@dataclass(frozen=True)
class RuleSet:
    """An ordered set of rules; order breaks ties between equally strong evidence."""

    rules: tuple[Rule, ...]
    warning_line: re.Pattern[str]
    sources: tuple[str, ...] = ()


_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml parses ~10x faster


class _LineLoader(_BaseLoader):  # type: ignore[misc]
    """A YAML loader that remembers the line of every mapping key, for error messages."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = _Located(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    mapping.lines = {str(k.value): k.start_mark.line + 1 for k, _ in node.value}
    return mapping


class _Located(dict[str, Any]):
    line: int = 0
    lines: dict[str, int]


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def shipped_rules_text() -> str:
    """The rule file shipped with trainguard."""
    return resources.files("trainguard.core.triage").joinpath("rules.yaml").read_text("utf-8")


def parse_rule_file(text: str, source: str, check_patterns: bool = True,
                    ) -> tuple[list[Rule], str | None]:
    """Validate one rule file; return its rules and its ``warning_line`` override, if any.

    ``check_patterns=False`` leaves compiling the log patterns to their first use: for the
    shipped file, whose patterns the tests compile, so that start-up does not pay for it.
    """
    try:
        doc = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise RuleFileError(f"{source}:1: not valid YAML: nested too deeply to read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RuleFileError(f"{source}:{line}: not valid YAML: {problem}") from None
    if not isinstance(doc, _Located) or not isinstance(doc.get("rules"), list):
        raise RuleFileError(f"{source}:1: rules: expected a top-level mapping with a 'rules' list")
    unknown = set(doc) - {"rules", "warning_line", "version"}
    if unknown:
        key = sorted(unknown)[0]
        raise RuleFileError(f"{source}:{doc.lines[key]}: {key}: unknown top-level key; "
                            "expected rules, warning_line or version")
    warning = doc.get("warning_line")
    if warning is not None:
        _regex(warning, source, doc.lines["warning_line"], "warning_line", False)
    rules: list[Rule] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(doc["rules"]):
        where = f"rules[{index}]"
        if not isinstance(raw, _Located):
            raise RuleFileError(f"{source}:{doc.lines['rules']}: {where}: expected a mapping")
        rule = _parse_rule(raw, source, where, check_patterns)
        if rule.id in seen:
            raise RuleFileError(f"{source}:{raw.lines['id']}: {where} ({rule.id}).id: {rule.id!r} "
                                f"is already defined on line {seen[rule.id]}")
        seen[rule.id] = raw.lines["id"]
        if not raw.get("disabled", False):
            rules.append(rule)
        else:
            rules.append(_disabled(rule))
    return rules, warning


def _disabled(rule: Rule) -> Rule:
    # A disabled rule keeps its id so it can still override (and so silence) a shipped rule.
    return Rule(id=rule.id, category=rule.category, strength=-1)


def _parse_rule(raw: _Located, source: str, where: str, check_patterns: bool = True) -> Rule:
    rule_id = raw.get("id")
    if isinstance(rule_id, str) and _ID.match(rule_id):
        where = f"{where} ({rule_id})"

    def fail(key: str, message: str) -> RuleFileError:
        line = raw.lines.get(key, raw.line)
        return RuleFileError(f"{source}:{line}: {where}.{key}: {message}")

    if not isinstance(rule_id, str) or not _ID.match(rule_id):
        raise fail("id", "required: a lower-case id such as 'cuda_oom.torch'")
    for key in raw:
        if key not in _KEYS:
            raise fail(key, f"unknown field; expected one of: {', '.join(sorted(_KEYS))}")
    category, strength, context_lines = _scalars(raw, fail)
    ignore_case = bool(raw.get("ignore_case", False))
    patterns = {k: _strings(raw, k, fail) for k in ("log", "log_not", "context", "context_not")}
    for key, values in patterns.items():
        for pattern in values if check_patterns else ():
            _regex(pattern, source, raw.lines[key], f"{where}.{key}", ignore_case)
    for key in ("context", "context_not"):
        if patterns[key] and not patterns["log"]:
            raise fail(key, "needs a 'log' pattern to be the context of")
    rule = Rule(
        id=rule_id, category=category, strength=strength,
        retryable=raw.get("retryable"), description=_description(raw, fail),
        log=patterns["log"], log_not=patterns["log_not"],
        context=patterns["context"], context_not=patterns["context_not"], context_lines=context_lines,
        warnings=bool(raw.get("warnings", False)), ignore_case=ignore_case,
        exit_codes=_exit_codes(raw, fail),
        reasons=frozenset(s.lower() for s in _strings(raw, "reasons", fail)),
        conditions=_conditions(raw, fail), events=_events(raw, fail, source, where),
        victim=bool(raw.get("victim", False)), wrapper=bool(raw.get("wrapper", False)),
        pid_group=_pid_group(raw, fail, patterns["log"] if check_patterns else ()),
    )
    if not (rule.log or rule.has_platform_matchers) and not raw.get("disabled", False):
        raise fail("log", "a rule needs at least one matcher: log, exit_codes, signals, "
                          "reasons, conditions or events")
    return rule


def _scalars(raw: _Located, fail: Any) -> tuple[Category, int, int]:
    """Validate the single-valued fields; return category, strength and context window."""
    category = raw.get("category")
    if category not in {c.value for c in Category}:
        valid = ", ".join(c.value for c in Category)
        raise fail("category", f"{category!r} is not a category; expected one of: {valid}")
    strength = raw.get("strength", "cause")
    if strength not in STRENGTHS:
        raise fail("strength", f"{strength!r}; expected one of: {', '.join(STRENGTHS)}")
    for key in ("retryable", "warnings", "ignore_case", "disabled", "victim", "wrapper"):
        if key in raw and not isinstance(raw[key], bool):
            raise fail(key, "expected true or false")
    context_lines = raw.get("context_lines", 40)
    if not isinstance(context_lines, int) or isinstance(context_lines, bool) or context_lines < 0:
        raise fail("context_lines", "expected a non-negative whole number of lines")
    return Category(category), STRENGTHS[strength], context_lines


def _pid_group(raw: _Located, fail: Any, patterns: tuple[str, ...]) -> int | None:
    value = raw.get("pid_group")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or not raw.get("victim"):
        raise fail("pid_group", "expected the number (1, 2, ...) of the log patterns' group that "
                                "names the lost process, on a rule with victim: true")
    for pattern in patterns:
        if re.compile(pattern).groups < value:
            raise fail("pid_group", f"{pattern!r} has no group {value}")
    return int(value)


def _description(raw: _Located, fail: Any) -> str:
    value = raw.get("description", "")
    if not isinstance(value, str):
        raise fail("description", "expected one sentence saying which mechanism the rule recognises")
    return " ".join(value.split())


def _strings(raw: _Located, key: str, fail: Any) -> tuple[str, ...]:
    value = raw.get(key, ())
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise fail(key, "expected a string or a list of strings")
    return tuple(value)


def _regex(pattern: Any, source: str, line: int, where: str, ignore_case: bool) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise RuleFileError(f"{source}:{line}: {where}: expected a regular expression string")
    try:
        return re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise RuleFileError(f"{source}:{line}: {where}: invalid regular expression "
                            f"{pattern!r}: {exc}") from None


def _exit_codes(raw: _Located, fail: Any) -> frozenset[int]:
    codes: set[int] = set()
    values = raw.get("exit_codes", [])
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                               for v in values):
        raise fail("exit_codes", "expected a list of whole numbers, e.g. [126, 127]")
    codes.update(values)
    sigs = raw.get("signals", [])
    if not isinstance(sigs, list):
        raise fail("signals", "expected a list of signal names, e.g. [SIGSEGV, SIGABRT]")
    for name in sigs:
        try:
            number = int(signal.Signals[str(name).upper()]) if not isinstance(name, int) else name
        except KeyError:
            raise fail("signals", f"{name!r} is not a signal name such as SIGSEGV") from None
        codes.update({-number, 128 + number})
    return frozenset(codes)


def _conditions(raw: _Located, fail: Any) -> tuple[ConditionMatcher, ...]:
    values = raw.get("conditions", [])
    if not isinstance(values, list):
        raise fail("conditions", "expected a list of {type, reason, status} mappings")
    out = []
    for value in values:
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise fail("conditions", "each entry needs a 'type', e.g. {type: DisruptionTarget}")
        out.append(ConditionMatcher(value["type"], value.get("reason"), value.get("status")))
    return tuple(out)


def _events(raw: _Located, fail: Any, source: str, where: str) -> tuple[EventMatcher, ...]:
    values = raw.get("events", [])
    if not isinstance(values, list):
        raise fail("events", "expected a list of {reason, message} regex mappings")
    out = []
    line = raw.lines.get("events", raw.line)
    for value in values:
        if not isinstance(value, dict) or not ({"reason", "message"} & set(value)):
            raise fail("events", "each entry needs a 'reason' or a 'message' regex")
        reason = value.get("reason")
        message = value.get("message")
        out.append(EventMatcher(
            _regex(reason, source, line, f"{where}.events.reason", False) if reason else None,
            _regex(message, source, line, f"{where}.events.message", False) if message else None,
        ))
    return tuple(out)


def layer(shipped: list[Rule], user: list[Rule]) -> list[Rule]:
    """User rules replace shipped rules with the same id in place; new user rules go first."""
    by_id = {rule.id: rule for rule in user}
    merged = [by_id.pop(rule.id, rule) for rule in shipped]
    fresh = [rule for rule in user if rule.id in by_id]
    return [rule for rule in fresh + merged if rule.strength >= 0]


def read_user_file(path: str | os.PathLike[str]) -> str:
    """Read a user's rule file, turning an unreadable file into a one-line RuleFileError."""
    try:
        return Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleFileError(f"{os.fspath(path)}:0: cannot read the rule file: {exc}") from None


def build(rules: list[Rule], warning_line: str, sources: tuple[str, ...]) -> RuleSet:
    """Assemble a RuleSet from already validated, layered rules."""
    return RuleSet(tuple(rules), re.compile(warning_line), sources)


def mapping_get(obj: Mapping[str, Any], *keys: str) -> Any:
    """The first present key of a wire-form mapping (``reason`` or ``Reason``)."""
    for key in keys:
        if key in obj:
            return obj[key]
    return None


def strength_name(value: int) -> str:
    """The name of a strength value ("cause", "hint", ...)."""
    return next((name for name, v in STRENGTHS.items() if v == value), str(value))
