"""Fingerprints: the same root cause gives the same value across attempts, ranks and steps.

Whatever varies between two occurrences of one failure (step and iteration numbers, sizes,
addresses, pids, timestamps, ranks, GPU indices) is masked before hashing; what names the failure
(the category, the deciding rule and the message's words) is kept.
"""

from __future__ import annotations

import hashlib
import re

from trainguard.core.taxonomy import Category

_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>"),
    (re.compile(r"\b[0-9a-fA-F]{8,}\b|\b[0-9a-f]{4,}(?:-[0-9a-f]{4,}){2,}\b"), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?\s*(?:[KMGTP]i?B|bytes|[KMGT]\b)", re.IGNORECASE), "<size>"),
    (re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?"), "#"),
    (re.compile(r"\s+"), " "),
)


def normalise(signature: str) -> str:
    """The signature with everything that varies between occurrences masked."""
    for pattern, replacement in _MASKS:
        signature = pattern.sub(replacement, signature)
    return signature.strip()


def fingerprint(category: Category, rule_id: str, signature: str) -> str:
    """A short stable hash of the category, the rule and the masked signature."""
    text = "\x1f".join((category.value, rule_id, normalise(signature)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
