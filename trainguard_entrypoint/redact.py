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
from collections.abc import Callable, Iterable, Mapping, Sequence

REDACTED = "***"

# Words of variable names whose values are treated as secrets, matched case-insensitively against
# the name's words (split at "_", "-", "." and camelCase humps): HF_TOKEN and apiKey are secrets,
# TOKENIZER_NAME, KEYBOARD_LAYOUT and max_tokens are not.
SECRET_NAME_PARTS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "WEBHOOK")
# Words that are secrets too: plurals, and run-together names (HFTOKEN, DBPASSWORD) ending in a
# part; KEY is left out of the endings, which would take in MONKEY and HOCKEY.
_SECRET_WORDS = frozenset({*SECRET_NAME_PARTS, "SECRETS", "CREDENTIALS", "APIKEY", "ACCESSKEY", "SECRETKEY",
                           "PRIVATEKEY", "PASSPHRASE"})
_SECRET_ENDINGS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIALS", "WEBHOOK")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_CAMEL_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z][a-z])")

SECRET_NAMES_VARIABLE = "TRAINGUARD_SECRET_NAMES"
"""Comma-separated names of variables that hold secrets whatever they are called (a spec's
``secret_env``): the launcher sets it, and their values are masked like any secret's."""

# Shorter values ("1", "true", "cpu") would mask half the log; CI systems draw the same line.
MIN_MASKED_LENGTH = 6

# No rule matches more than this many characters of a token, an assigned value or a run of blanks,
# so text can be masked in bounded windows that overlap by `_REACH` (`MaskingStream`) with exactly
# the result of masking it whole. Real tokens are under 256 characters; of a longer run, the first
# 4096 characters are masked.
MAX_TOKEN_CHARS = 4096
_MAX_BLANKS = 256
_REACH = 2 * MAX_TOKEN_CHARS  # > the longest match of any rule but the values, plus one character after it
_CONTEXT = 128  # > how far before a match its acceptance looks (a name's start, a URL's scheme)

# Strings that are secrets by their shape alone, wherever they appear. Every pattern starts with a
# literal, so the regex engine finds candidates by fast substring search, whatever the line's
# length; the word boundary a token needs before it is checked in Python, on the few matches, so
# no rule scans the text position by position. The ``secret`` group is what becomes ``***``.
_T = "," + str(MAX_TOKEN_CHARS) + "}"
_SHAPE_RULES: tuple[tuple[re.Pattern[str], bool], ...] = tuple(
    (re.compile(pattern), bounded) for pattern, bounded in (
        (r"(?P<secret>(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16})\b", True),  # AWS key ids
        (r"(?P<secret>hf_[A-Za-z0-9]{20" + _T + ")", True),  # Hugging Face
        (r"(?P<secret>gh[pousr]_[A-Za-z0-9]{20" + _T + ")", True),  # GitHub
        (r"(?P<secret>github_pat_[A-Za-z0-9_]{20" + _T + ")", True),
        (r"(?P<secret>xox[abposr]-[A-Za-z0-9-]{10" + _T + ")", True),  # Slack tokens
        (r"hooks\.slack\.com/(?P<secret>(?:services|workflows|triggers)/[A-Za-z0-9_/+-]{1" + _T + ")", False),
        (r"(?P<secret>sk-(?:proj-)?[A-Za-z0-9_-]{20" + _T + ")", True),  # OpenAI-style API keys
        (r"(?P<secret>glpat-[A-Za-z0-9_-]{20" + _T + ")", True),  # GitLab
        (r"(?P<secret>wandb_v1_[A-Za-z0-9_]{20" + _T + ")", True),  # Weights & Biases
    )
)
# NAME=value, NAME: value, "name": "value", spelled in any of the cases names are: matched from a
# secret-looking word of the name; `_secret_assignment` then reads the whole name and keeps the
# match only if `is_secret_name` agrees (so TOKENIZER_NAME=bert-base is left alone). The separator
# stays on its line, so masking a block of lines or each line of it gives the same text.
# Possessive runs: giving back a name character can never make a separator appear, so a candidate
# that fails costs one forward scan, not a backtrack.
_NAME_MAX = 64
_BLANKS = r"[ \t]{0," + str(_MAX_BLANKS) + "}"
_ASSIGNMENT = re.compile(
    r"(?P<name>(?:" + "|".join(f"{p}|{p.lower()}|{p.capitalize()}" for p in SECRET_NAME_PARTS) + r")"
    r"[A-Za-z0-9_]{0," + str(_NAME_MAX) + r"}+)"
    r"[\"']?" + _BLANKS + "[=:]" + _BLANKS + r"[\"']?(?P<secret>[^\s\"',;]{" + str(MIN_MASKED_LENGTH) + _T + ")"
)
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
# CSI (colours, cursor moves), OSC (titles, hyperlinks; ended by BEL or ST), other two-byte ESC
# sequences, then any C0/C1 control character left except tab.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[P^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]?|\x9b[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
    r"|[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"  # bidi marks, overrides and isolates reorder what is shown
)

# scheme://user:password@host -> scheme://user:***@host. The password stops at '@' or whitespace:
# a literal '@' inside a URL password must be percent-encoded, so the first '@' ends it.
# Scheme and user are bounded so a megabyte line without "://" costs one pass, not one per position.
_URL_CREDENTIALS = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s:/@]{0,256}):(?P<password>[^\s@/]{0,1024})@"
)


# The same, found from "://": the scheme before it is checked by `_scheme_ends_at`.
_URL_PASSWORD = re.compile(r"://[^\s:/@]{0,256}+:(?P<secret>[^\s@/]{0,1024}+)@")
_SCHEME_END = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]{0,31}\Z")


def is_secret_name(name: str) -> bool:
    """Whether a variable called ``name`` holds a secret by its name alone.

    A word of the name must be a secret's (``HF_TOKEN``, ``aws_secret_access_key``, ``apiKey``,
    ``DBPASSWORD``): a word that only starts with one (``TOKENIZER_NAME``, ``KEYBOARD_LAYOUT``) is
    not. camelCase humps split words only in names that start lower-case, as fields are spelled;
    ``KeyError`` is a class name. ``TRAINGUARD_SECRET_NAMES`` holds names, not a secret: were its
    value masked as one, every later mention of a declared name would be masked in its place.
    """
    if name == SECRET_NAMES_VARIABLE:
        return False
    if name[:1].islower():
        name = _CAMEL_HUMP.sub("_", name)
    words = _WORD_SPLIT.split(name.upper())
    return any(word in _SECRET_WORDS or word.endswith(_SECRET_ENDINGS) for word in words if word)


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
        self._longest = len(ordered[0]) if ordered else 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], extra: Iterable[str] = ()) -> Masker:
        """A masker for the values of every secret-looking variable in ``environ``, plus ``extra``."""
        declared = declared_secret_names(environ)
        return cls([*(v for k, v in environ.items() if is_secret_name(k) or k in declared), *extra])

    def mask(self, text: str) -> str:
        """``text`` with every known secret value and token shape replaced by ``***``.

        One pass for the values (a single alternation, longest first), then plain substring
        searches for the shapes' literals, each pattern tried only where its literal starts; the cost grows with the text's length, not with the
        number of rules times its length.
        """
        if self._values is not None:
            text = self._values.sub(REDACTED, text)
        # rule by rule, each on the text the one before left: a "***" that ends a token is a word
        # boundary the next rule may start after
        for pattern, bounded in _SHAPE_RULES:
            text = _mask_matches(text, pattern, _starts_word if bounded else _anywhere)
        text = _mask_matches(text, _ASSIGNMENT, _secret_assignment)
        return _mask_matches(text, _URL_PASSWORD, _scheme_before)

    def for_people(self, text: str) -> str:
        """Masked and without terminal control sequences: text fit for a tail, a table or a report."""
        return self.mask(strip_control(text))

    def for_own_words(self, text: str) -> str:
        """trainguard's own message: only the known secret values it may quote are masked, never a token
        shape (its help reads ``secret_env: {WANDB_API_KEY: 'env:VARIABLE'}``), and control sequences go."""
        text = strip_control(text)
        return self._values.sub(REDACTED, text) if self._values is not None else text

    def stream(self) -> MaskingStream:
        """A `MaskingStream` that masks text fed in pieces exactly as `mask` masks it whole."""
        passes = [_Pass(self._values, _anywhere, self._longest, merge=False)] if self._values is not None else []
        passes += [_Pass(pattern, _starts_word if bounded else _anywhere, _REACH) for pattern, bounded in _SHAPE_RULES]
        passes += [_Pass(_ASSIGNMENT, _secret_assignment, _REACH), _Pass(_URL_PASSWORD, _scheme_before, _REACH)]
        return MaskingStream(passes)


class MaskingStream:
    """Masks text fed in pieces (a log with a gigabyte line) in bounded memory, as `Masker.mask` would.

    Each rule runs as a pass over the output of the one before, as in `Masker.mask`. A pass settles
    its text up to `_REACH` characters (the values' pass: the longest value) before the end of what
    it holds, since no match starting earlier can reach further, and keeps `_CONTEXT` characters
    of what it settled for the look back a match's acceptance takes; so a secret that straddles
    two pieces is masked as if the text were whole. Holds about a piece plus 10 KiB a rule.
    """

    def __init__(self, passes: list[_Pass]) -> None:
        self._passes = passes

    def feed(self, text: str) -> str:
        """The masked text that is settled once ``text`` is added (possibly "")."""
        for one in self._passes:
            text = one.feed(text, final=False)
        return text

    def close(self) -> str:
        """The rest, masked: call once at the end."""
        text = ""
        for one in self._passes:
            text = one.feed(text, final=True)
        return text


class _Pass:
    """One rule over a stream of text: what it holds back, and how its last masked span ended."""

    def __init__(self, pattern: re.Pattern[str], accept: Callable[[str, re.Match[str]], bool], reach: int,
                 merge: bool = True) -> None:
        self.pattern, self.accept, self.reach, self.merge = pattern, accept, reach + 1, merge
        self.context, self.pending, self.joined = "", "", False

    def feed(self, text: str, final: bool) -> str:
        self.pending += text
        if not final and len(self.pending) <= self.reach:
            return ""
        buffer, start = self.context + self.pending, len(self.context)
        stop = None if final else len(buffer) - self.reach
        spans, position = _find_spans(buffer, self.pattern, self.accept, start, stop)
        cut = len(buffer) if final else max(stop or 0, position)
        out = _masked(buffer[start:cut], [(a - start, b - start) for a, b in spans], self.merge)
        if self.merge and self.joined and spans and spans[0][0] == start:
            out = out[len(REDACTED):]  # it touches the span the last piece ended with: one "***" for both
        self.joined = bool(spans) and spans[-1][1] == cut
        self.context, self.pending = buffer[max(start, cut - _CONTEXT):cut], buffer[cut:]
        return out


def _mask_matches(text: str, pattern: re.Pattern[str], accept: Callable[[str, re.Match[str]], bool]) -> str:
    """``text`` with the ``secret`` group of every accepted match of ``pattern`` masked."""
    spans, _ = _find_spans(text, pattern, accept, 0, None)
    return _masked(text, spans) if spans else text


def _find_spans(text: str, pattern: re.Pattern[str], accept: Callable[[str, re.Match[str]], bool], position: int,
                stop: int | None) -> tuple[list[tuple[int, int]], int]:
    """The ``secret`` (else whole) spans of the accepted matches starting before ``stop``, and where to go on.

    A rejected match is retried from its next character, so a token inside it is still found.
    """
    spans: list[tuple[int, int]] = []
    group = "secret" if "secret" in pattern.groupindex else 0
    while (found := pattern.search(text, position)) and (stop is None or found.start() < stop):
        if accept(text, found):
            spans.append(found.span(group))
            position = max(found.end(), found.start() + 1)
        else:
            position = found.start() + 1
    return spans, position


def _scheme_before(text: str, found: re.Match[str]) -> bool:
    """Whether a URL scheme (``https``, ``postgres+asyncpg``) ends where ``found`` starts."""
    index = found.start()
    return _SCHEME_END.search(text, max(0, index - 33), index) is not None


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _word_before(text: str, index: int) -> bool:
    return index > 0 and _is_word(text[index - 1])


def _starts_word(text: str, found: re.Match[str]) -> bool:
    return not _word_before(text, found.start())


def _anywhere(text: str, found: re.Match[str]) -> bool:
    return True


def _secret_assignment(text: str, found: re.Match[str]) -> bool:
    """Whether the name that reaches into ``found`` starts a word, is short enough and is a secret's."""
    index = found.start()
    start, lowest = index, max(0, index - _NAME_MAX - 1)
    while start > lowest and text[start - 1] in _NAME_CHARS:
        start -= 1
    name = text[start:found.end("name")]
    return len(name) <= _NAME_MAX and not _word_before(text, start) and is_secret_name(name)


def _masked(text: str, spans: list[tuple[int, int]], merge: bool = True) -> str:
    """``text`` with each span replaced by ``***`` (spans that overlap or touch as one, with ``merge``)."""
    pieces: list[str] = []
    done = 0
    for start, end in sorted(spans):
        if merge and pieces and start <= done:
            done = max(done, end)  # overlaps or touches the span masked just before
            continue
        pieces += [text[done:start], REDACTED]
        done = end
    pieces.append(text[done:])
    return "".join(pieces)
