"""Redaction of secrets: by variable name in snapshots, by value in any text trainguard writes or shows.

Only the rules for *what* counts as a secret belong here; where snapshots are written does not.
`Masker` masks text the way CI systems mask secrets: every value of a secret-looking variable,
and every string with the shape of a known token (AWS access keys, Hugging Face and GitHub
tokens, Slack tokens and webhook paths, URL passwords, ``SECRET_NAME=value`` assignments), is
replaced with ``***``. `strip_control` removes terminal control sequences from text meant for
people. The core imports these functions too, so both sides redact the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

REDACTED = "***"

# Substrings of variable names whose values are treated as secrets, matched case-insensitively.
SECRET_NAME_PARTS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "WEBHOOK")

SECRET_NAMES_VARIABLE = "TRAINGUARD_SECRET_NAMES"
"""Comma-separated names of variables that hold secrets whatever they are called (a spec's
``secret_env``): the launcher sets it, and their values are masked like any secret's."""

# Shorter values ("1", "true", "cpu") would mask half the log; CI systems draw the same line.
MIN_MASKED_LENGTH = 6

# Strings that are secrets by their shape alone, wherever they appear, each with the literal text
# that must occur for it to match: a line without any of them skips the pattern (a megabyte line
# costs a few substring searches, not a regex pass per shape).
_TOKEN_SHAPES = (
    (("AKIA", "ASIA", "AGPA", "AIDA", "AROA"), r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"),  # AWS key ids
    (("hf_",), r"\bhf_[A-Za-z0-9]{20,}"),  # Hugging Face
    (("gh", "github_pat_"), r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),  # GitHub
    (("xox",), r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack tokens
    (("hooks.slack.com/",), r"(?<=hooks\.slack\.com/)(?:services|workflows|triggers)/[A-Za-z0-9_/+-]+"),  # webhooks
    (("sk-",), r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}"),  # OpenAI-style API keys
    (("glpat-",), r"\bglpat-[A-Za-z0-9_-]{20,}"),  # GitLab
    (("wandb_v1_",), r"\bwandb_v1_[A-Za-z0-9_]{20,}"),  # Weights & Biases
)
_SHAPES = tuple((literals, re.compile(pattern)) for literals, pattern in _TOKEN_SHAPES)
# NAME=value or NAME: value where NAME looks like a secret's (upper case, as variables are spelled)
_ASSIGNMENT = re.compile(
    r"(?P<name>\b[A-Z0-9_]{0,64}(?:" + "|".join(SECRET_NAME_PARTS) + r")[A-Z0-9_]{0,64})"
    r"(?P<sep>\s*[=:]\s*)(?P<quote>[\"']?)(?P<value>[^\s\"',;]{" + str(MIN_MASKED_LENGTH) + r",})"
)
# CSI (colours, cursor moves), OSC (titles, hyperlinks; ended by BEL or ST), other two-byte ESC
# sequences, then any C0/C1 control character left except tab.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[P^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]?|\x9b[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)

# scheme://user:password@host -> scheme://user:***@host. The password stops at '@' or whitespace:
# a literal '@' inside a URL password must be percent-encoded, so the first '@' ends it.
# Scheme and user are bounded so a megabyte line without "://" costs one pass, not one per position.
_URL_CREDENTIALS = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s:/@]{0,256}):(?P<password>[^\s@/]{0,1024})@"
)


def is_secret_name(name: str) -> bool:
    """Whether a variable called ``name`` holds a secret by its name alone."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def declared_secret_names(environ: Mapping[str, str]) -> frozenset[str]:
    """Names listed in ``TRAINGUARD_SECRET_NAMES``: secrets whatever they are called."""
    return frozenset(n.strip() for n in environ.get(SECRET_NAMES_VARIABLE, "").split(",") if n.strip())


def redact_text(text: str) -> str:
    """Replace the password of every ``scheme://user:password@host`` in ``text`` with ``***``."""
    if "://" not in text:
        return text
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
    declared = declared_secret_names(environ)
    # a declared secret's value may also sit in the variable it was copied from, under any name
    masker = Masker(environ[name] for name in declared if name in environ)
    for name in sorted(environ):
        value = environ[name]
        safe = REDACTED if is_secret_name(name) or name in declared else masker.mask(value)
        if safe != value:
            changed.append(name)
        redacted[name] = safe
    return redacted, changed


def strip_control(text: str) -> str:
    """``text`` without terminal control sequences (ANSI colours, OSC titles and links, control bytes).

    For text shown to people (tails, tables): the raw log keeps the bytes as they were.
    """
    if text.isprintable():
        return text  # the common case, decided in one C-speed pass
    return _CONTROL.sub("", text)


class Masker:
    """Replaces secret values in text with ``***``: the values given, and known token shapes."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values = frozenset(v for v in values if isinstance(v, str) and len(v) >= MIN_MASKED_LENGTH)
        # longest first, so a secret that contains another is masked whole
        ordered = sorted(self.values, key=len, reverse=True)
        self._values = re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], extra: Iterable[str] = ()) -> Masker:
        """A masker for the values of every secret-looking variable in ``environ``, plus ``extra``."""
        declared = declared_secret_names(environ)
        return cls([*(v for k, v in environ.items() if is_secret_name(k) or k in declared), *extra])

    def with_values(self, values: Iterable[str]) -> Masker:
        """This masker plus more values."""
        return Masker([*self.values, *values])

    def mask(self, text: str) -> str:
        """``text`` with every known secret value and token shape replaced by ``***``."""
        if self._values is not None and any(value in text for value in self.values):
            text = self._values.sub(REDACTED, text)
        for literals, shape in _SHAPES:
            if any(literal in text for literal in literals):
                text = shape.sub(REDACTED, text)
        if any(part in text for part in SECRET_NAME_PARTS):
            text = _ASSIGNMENT.sub(lambda m: f"{m.group('name')}{m.group('sep')}{m.group('quote')}{REDACTED}", text)
        return redact_text(text)

    def for_people(self, text: str) -> str:
        """Masked and without terminal control sequences: text fit for a tail, a table or a report."""
        return self.mask(strip_control(text))
