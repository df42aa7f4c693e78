"""Masking secrets and terminal sequences in everything trainguard writes or shows.

The rules (which names are secret, which token shapes, how control sequences look) are the
entrypoint's (``trainguard_entrypoint.redact``), so the training container and the flow mask the
same way. This module adds what only the flow side knows: the secret values resolved at run time
(`register`, like a CI system's ``add-mask``) and the flow process's own environment, and applies
the masker to nested data. Deciding where text is written or shown is the caller's concern.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from trainguard_entrypoint.redact import (
    REDACTED, SECRET_NAMES_VARIABLE, Masker, declared_secret_names, is_secret_name, strip_control,
)

__all__ = [
    "REDACTED", "SECRET_NAMES_VARIABLE", "Masker", "current", "for_own_words", "for_people", "is_secret_name", "mask_tree", "register",
    "register_environment", "strip_control",
]

_lock = threading.Lock()
_registered: set[str] = set()
_cache: tuple[frozenset[str], Masker] | None = None


def register(values: Iterable[str]) -> None:
    """Mask these values from now on in this process (secrets resolved at run time)."""
    with _lock:
        _registered.update(v for v in values if isinstance(v, str) and v)


def register_environment(environ: Mapping[str, str]) -> None:
    """Mask the values of every secret-looking variable of ``environ`` (and those it declares secret) from now on."""
    declared = declared_secret_names(environ)
    register(value for name, value in environ.items() if is_secret_name(name) or name in declared)


def current() -> Masker:
    """A masker for every registered value and every secret variable of this process's environment."""
    global _cache
    with _lock:
        values = frozenset([*_registered, *(v for k, v in os.environ.items() if is_secret_name(k))])
        if _cache is None or _cache[0] != values:
            _cache = (values, Masker(values))
        return _cache[1]


def for_people(text: str, masker: Masker | None = None) -> str:
    """``text`` masked and without terminal control sequences."""
    return (masker or current()).for_people(text)


def for_own_words(text: str, masker: Masker | None = None) -> str:
    """trainguard's own message (an error, a help line): known secret values masked, its wording never."""
    return (masker or current()).for_own_words(text)


def mask_tree(value: Any, masker: Masker | None = None) -> Any:
    """A copy of JSON-like ``value`` with every string (keys included) masked."""
    masker = masker or current()
    if isinstance(value, str):
        return masker.mask(value)
    if isinstance(value, Mapping):
        return {mask_tree(k, masker): mask_tree(v, masker) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_tree(v, masker) for v in value]
    return value
