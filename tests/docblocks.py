"""Command blocks of the project's Markdown pages, run as written and held to what the text promises.

A fenced shell block is tested when an HTML comment right before it (blank lines between are
allowed) says what running it must do:

    <!-- doc-test: exit=0 timeout=900 expect="Completed" expect="resumed from" -->
    ```bash
    ./dev kubesim-run examples/ddp/spec-2-nodes.yaml
    ```

`timeout` (seconds, required) bounds the block; `exit` is the exit status it must end with (0 by
default); every `expect` is text its output (stdout and stderr together) must contain. A block that
cannot run here says why instead: `<!-- doc-test: skip="needs a real cluster" -->`. HTML comments
are invisible in rendered Markdown and pass through mkdocs unchanged, so a block keeps its marker
when it moves to a docs page; a test of that page calls `blocks(page)` and `run(block, ...)` as the
README's test does.

Each block runs verbatim as one `bash -e -o pipefail` script, in a session of its own (a timeout
ends all of it), from the folder given (a copy of the checkout, so the page's relative paths hold).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MARKER = "doc-test:"
_MARKER_RE = re.compile(r"^\s*<!--\s*doc-test:(.*?)-->")  # a line of its own, not prose quoting one
_FENCE_RE = re.compile(r"^(```+|~~~+)\s*(\w*)")
SHELLS = ("bash", "sh", "shell", "console")
TAIL_LINES = 40


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, what it says, and what its marker promises."""

    page: Path
    line: int            # of the opening fence, 1-based
    heading: str         # the nearest heading above it
    language: str
    text: str
    marked: bool
    timeout: float | None = None
    exit: int = 0
    expect: tuple[str, ...] = ()
    skip: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line} ({self.heading})"

    @property
    def is_shell(self) -> bool:
        return self.language in SHELLS


class MarkerError(ValueError):
    """A doc-test marker that cannot be read; the message names the page, line and fix."""


def _marker(raw: str, page: Path, line: int) -> dict[str, object]:
    try:
        words = shlex.split(raw)
    except ValueError as exc:
        raise MarkerError(f"{page.name}:{line}: doc-test marker: {exc}") from None
    fields: dict[str, object] = {"expect": []}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or key not in ("exit", "timeout", "expect", "skip"):
            raise MarkerError(f"{page.name}:{line}: doc-test marker: {word!r} is not one of "
                              "exit=N, timeout=SECONDS, expect=\"text\", skip=\"reason\"")
        if key == "expect":
            fields["expect"].append(value)  # type: ignore[attr-defined]
        elif key in ("exit", "timeout"):
            try:
                fields[key] = int(value) if key == "exit" else float(value)
            except ValueError:
                raise MarkerError(f"{page.name}:{line}: doc-test marker: {key}={value!r} is not "
                                  "a number") from None
        else:
            fields[key] = value
    if "skip" not in fields and "timeout" not in fields:
        raise MarkerError(f"{page.name}:{line}: doc-test marker without timeout=SECONDS: every "
                          "tested block needs a bound, so that it can never hang unnoticed")
    return fields


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a Markdown page, with its marker's promises when it has one."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    heading, pending, pending_line = "", None, 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading, pending = line.lstrip("#").strip(), None
        elif line.lstrip().startswith("<!--") and (m := _MARKER_RE.search(line)) is not None:
            pending, pending_line = _marker(m.group(1), page, i + 1), i + 1
        elif (fence := _FENCE_RE.match(line)) is not None:
            close, start = fence.group(1), i
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].startswith(close):
                body.append(lines[i])
                i += 1
            fields = pending or {}
            found.append(Block(
                page, start + 1, heading, fence.group(2), "\n".join(body) + "\n", pending is not None,
                timeout=fields.get("timeout"), exit=int(fields.get("exit", 0)),  # type: ignore[arg-type]
                expect=tuple(fields.get("expect", ())), skip=fields.get("skip")))  # type: ignore[arg-type]
            pending = None
        elif line.strip() and pending is not None and not line.lstrip().startswith("<!--"):
            raise MarkerError(f"{page.name}:{pending_line}: a doc-test marker must come right "
                              f"before a fenced block; line {i + 1} comes between")
        i += 1
    if pending is not None:
        raise MarkerError(f"{page.name}:{pending_line}: a doc-test marker with no block after it")
    return found


@dataclass(frozen=True)
class Ran:
    """How a block's run ended."""

    exit: int | None     # None: still running at its timeout (then killed)
    output: str
    seconds: float

    def tail(self) -> str:
        return "\n".join(self.output.splitlines()[-TAIL_LINES:])


def run(block: Block, cwd: Path, env: dict[str, str]) -> Ran:
    """Run the block as written, in cwd, ending it (its whole session) at its timeout."""
    assert block.timeout is not None, f"{block.where}: not a tested block"
    started = time.monotonic()
    process = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=cwd, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: process.stdout.read1(65536), b"")),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    try:
        code: int | None = process.wait(block.timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # leftovers of the block's own session
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        reader.join(10)
    return Ran(code, b"".join(chunks).decode(errors="replace"), time.monotonic() - started)


def verdict(block: Block, ran: Ran) -> str | None:
    """None when the run kept the block's promises; else what it was waiting for, and what came."""
    promised = f"exit {block.exit}" + "".join(f", output containing {e!r}" for e in block.expect)
    if ran.exit is None:
        return (f"{block.where}: still running after its timeout of {block.timeout:.0f} s; it was "
                f"waiting for {promised}. Its last lines:\n{ran.tail()}")
    missing = [e for e in block.expect if e not in ran.output]
    if ran.exit != block.exit or missing:
        what = (f"exit {ran.exit}" if ran.exit != block.exit else "") + (
            f"{', ' if ran.exit != block.exit else ''}no {', '.join(map(repr, missing))} in its output"
            if missing else "")
        return (f"{block.where}: promised {promised}; got {what} after {ran.seconds:.0f} s. "
                f"Its last lines:\n{ran.tail()}")
    return None
