"""Numbers and nesting a job writes into the files triage and the supervisors read: never a crash.

A job controls `progress.json`, `stacks/index.json` and torchelastic's error files. JSON nested
100,000 deep makes Python's parser raise RecursionError; a 400-digit integer is valid JSON that
`float` refuses with OverflowError. Either one must read as "no such record", not end the
supervisor (before a stall's cancel), `trainguard dump` or the judging of the attempt.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.core.backends import forensics
from trainguard.core.triage.errorfile import parse_error_file

HUGE = int("9" * 400)


def test_an_error_file_nested_100000_deep_is_no_error_file() -> None:
    assert parse_error_file("[" * 100_000) is None
    assert parse_error_file('{"message": ' + "{" * 100_000) is None


def test_an_error_files_400_digit_timestamp_is_no_time_and_the_rest_is_kept() -> None:
    doc = {"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback\nRuntimeError: boom",
                                                                          "timestamp": HUGE}, "errorCode": 1}}
    parsed = parse_error_file(json.dumps(doc))

    assert parsed is not None and (parsed.message, parsed.timestamp, parsed.exit_code) == ("RuntimeError: boom",
                                                                                           None, 1)
    assert parse_error_file(json.dumps({"message": {"message": "m", "extraInfo": {"timestamp": "1e999"}}})).timestamp \
        is None


def test_progress_and_stacks_records_with_400_digit_times_say_no_time(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "progress.json").write_text(json.dumps({"at": HUGE}), "utf-8")
    (tmp_path / "stacks" / "index.json").write_text(json.dumps({"started_at": HUGE, "ranks": {}}), "utf-8")

    assert forensics.last_progress([tmp_path]) is None
    assert forensics.stacks_taken(tmp_path) is None


def test_progress_and_stacks_records_nested_100000_deep_say_no_time(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "progress.json").write_text('{"at": ' + "[" * 100_000, "utf-8")
    (tmp_path / "stacks" / "index.json").write_text('{"started_at": ' + "[" * 100_000, "utf-8")

    assert forensics.last_progress([tmp_path]) is None
    assert forensics.stacks_taken(tmp_path) is None
