"""The short crash summary written to the container's termination-message file.

Kubernetes keeps at most 4 KiB of `/dev/termination-log` in the pod's status after the container
ends, where it survives when no volume and no log does. So the summary is small JSON: how the
command ended, where the full crash report is, and the last log lines (secrets in URLs redacted,
each line clipped), trimmed until it fits. The full report is `report.py`'s business.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainguard_entrypoint.redact import redact_text

LIMIT_BYTES = 4096
LINE_CHARS = 300
TAIL_LINES = 8
# A URL cut mid-password by the clipping: nothing of it may be shown.
_CUT_CREDENTIALS = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s/@]*:[^\s@/]*$")
KEYS = ("exit_code", "signal_name", "core_dumped", "start_error", "core_files", "hostname")


def summary(report: dict[str, Any], report_path: Path) -> bytes:
    """The termination message for `report` (the crash report payload), at most `LIMIT_BYTES`."""
    head: dict[str, Any] = {key: report.get(key) for key in KEYS}
    head["crash_report"] = str(report_path)
    newest = (report.get("checkpoints") or {}).get("newest") if isinstance(report.get("checkpoints"), dict) else None
    if newest:
        head["newest_checkpoint"] = newest
    tail = [_clip(str(line)) for line in (report.get("log_tail") or [])[-TAIL_LINES:]]
    while True:
        data = json.dumps({"trainguard": 1, **head, "log_tail": tail}, ensure_ascii=True).encode("ascii")
        if len(data) <= LIMIT_BYTES or not tail:
            return data[:LIMIT_BYTES]
        tail = tail[1:]


def _clip(line: str) -> str:
    """At most LINE_CHARS of `line`, URL passwords redacted (clipped first: the scan is not linear)."""
    return _CUT_CREDENTIALS.sub("...", redact_text(line[:LINE_CHARS]))


def write_summary(path: Path, report: dict[str, Any], report_path: Path) -> None:
    """Write the summary to `path` (the container's terminationMessagePath)."""
    with open(path, "wb") as fh:
        fh.write(summary(report, report_path))
