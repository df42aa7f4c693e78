"""Redaction of secret-looking values before an environment snapshot leaves the process.

Only the rules for *what* counts as a secret belong here; where snapshots are written does not.
The core imports these functions too, so both sides redact the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "***"

# Substrings of variable names whose values are treated as secrets, matched case-insensitively.
SECRET_NAME_PARTS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "CREDENTIAL")

# scheme://user:password@host -> scheme://user:***@host. The password stops at '@' or whitespace:
# a literal '@' inside a URL password must be percent-encoded, so the first '@' ends it.
_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*):(?P<password>[^\s@/]*)@")


def is_secret_name(name: str) -> bool:
    """Whether a variable called ``name`` holds a secret by its name alone."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def redact_text(text: str) -> str:
    """Replace the password of every ``scheme://user:password@host`` in ``text`` with ``***``."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Redact a command line: ``--api-key=X`` and ``--hf-token X`` values, and URL passwords anywhere."""
    redacted: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            redacted.append(REDACTED)
            hide_next = False
            continue
        name, equals, _ = arg.partition("=")
        is_flag = name.startswith("-") and is_secret_name(name.lstrip("-").replace("-", "_"))
        if is_flag and equals:
            redacted.append(f"{name}={REDACTED}")
        else:
            redacted.append(redact_text(arg))
            hide_next = is_flag
    return redacted


def redact_environment(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Return a redacted copy of ``environ`` and the sorted names whose values were changed.

    Args:
        environ: Variable names to values, e.g. ``os.environ``.
    """
    redacted: dict[str, str] = {}
    changed: list[str] = []
    for name in sorted(environ):
        value = environ[name]
        safe = REDACTED if is_secret_name(name) else redact_text(value)
        if safe != value:
            changed.append(name)
        redacted[name] = safe
    return redacted, changed
