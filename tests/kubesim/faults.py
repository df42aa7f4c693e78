"""Fault rules for API requests and the request log that tests assert on.

A rule matches requests (method, verb, resource, namespace, name, path regex, the addressed
object's labels) and then answers
with an error Status, delays the answer, or disturbs a watch stream (reset, clean end, 410).
Faults on nodes and pods (OOM kill, eviction, partition) live with the controllers.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from kubesim import selectors
from kubesim.errors import BadRequest

WATCH_ACTIONS = ("reset", "end", "expired")


@dataclass
class Rule:
    """One fault; None in a matcher field means "any"."""

    id: int
    method: str | None = None
    verb: str | None = None
    resource: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    path: str | None = None
    # Matches the labels of the object addressed (stored object, or the body of a create).
    label_selector: str | None = None
    status: int | None = None
    message: str | None = None
    retry_after: int | None = None
    delay: float = 0.0
    watch: str | None = None
    after: float = 0.0
    times: int | None = None
    probability: float | None = None
    seed: int = 0
    hits: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def matches(self, info: dict[str, Any]) -> bool:
        for key in ("method", "verb", "resource", "namespace", "name", "subresource"):
            wanted = getattr(self, key)
            if wanted is not None and info.get(key) != wanted:
                return False
        if self.path is not None and not re.search(self.path, info.get("path", "")):
            return False
        if self.watch is not None and info.get("verb") != "watch":
            return False
        if self.label_selector is not None and not selectors.label_matcher(
                self.label_selector)({"metadata": {"labels": info.get("labels") or {}}}):
            return False
        if self.times is not None and self.hits >= self.times:
            return False
        return self.probability is None or self._rng.random() < self.probability

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


_FIELDS = {f for f in Rule.__dataclass_fields__ if not f.startswith("_")} - {"id", "hits"}


class Faults:
    """The active rules and the log of every API request."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self.requests: list[dict[str, Any]] = []
        self._next_id = 1

    def add(self, raw: dict[str, Any]) -> Rule:
        """Add a rule from its JSON form; BadRequest names an unknown or contradictory field."""
        unknown = set(raw) - _FIELDS
        if unknown:
            raise BadRequest(f"fault rule: unknown field(s) {sorted(unknown)}; known: "
                             f"{sorted(_FIELDS)}")
        if raw.get("watch") is not None and raw["watch"] not in WATCH_ACTIONS:
            raise BadRequest(f"fault rule: watch must be one of {WATCH_ACTIONS}, "
                             f"not {raw['watch']!r}")
        if raw.get("status") is None and raw.get("watch") is None and not raw.get("delay"):
            raise BadRequest("fault rule: give status (an error code), delay (seconds) or watch "
                             "(reset|end|expired)")
        if raw.get("label_selector") is not None:
            selectors.label_matcher(raw["label_selector"])  # BadRequest for a bad selector
        rule = Rule(id=self._next_id, **raw)
        rule._rng.seed(rule.seed)
        self._next_id += 1
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    @property
    def wants_labels(self) -> bool:
        """Whether matching needs the labels of the object a request addresses."""
        return any(r.label_selector is not None for r in self.rules)

    def match(self, info: dict[str, Any]) -> Rule | None:
        """The first rule matching this request, counted as a hit."""
        for rule in self.rules:
            if rule.matches(info):
                rule.hits += 1
                return rule
        return None

    def log(self, info: dict[str, Any], rule: Rule | None) -> dict[str, Any]:
        """Log a request as it arrives; the caller sets "code" once it is answered.

        Logging on arrival keeps requests whose client gave up (slow faults) visible.
        """
        entry = {**info, "code": None, "time": time.time(), "fault": rule.id if rule else None}
        self.requests.append(entry)
        return entry
