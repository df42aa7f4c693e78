"""A linked folder in a job's attempt folder leads triage nowhere: stacks and error files are read through none.

The job can make `stacks`, `torchelastic` or any folder under `ranks/` a symbolic link to a folder
of its choosing (another run's, a host folder holding files shaped like these); and hard-link a
host file where a stack file should be. Triage reads none of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from stackfiles import py_spy_dump, write_index

from trainguard.core.backends import rankstacks, torchrun

ERROR = json.dumps({"message": {"message": "RuntimeError: elsewhere", "extraInfo": {"py_callstack": "Traceback\n",
                                                                                     "timestamp": "1"}}})


def _elsewhere(tmp_path: Path) -> Path:
    """A folder outside the attempt's, laid out as the files trainguard reads."""
    other = tmp_path / "elsewhere"
    (other / "stacks").mkdir(parents=True)
    (other / "stacks" / "rank-0.txt").write_text(py_spy_dump(2048), "utf-8")
    write_index(other, {0: "rank-0.txt"})
    (other / "torchelastic").mkdir()
    (other / "torchelastic" / "error.json").write_text(ERROR, "utf-8")
    (other / "ranks" / "run" / "attempt_0" / "0").mkdir(parents=True)
    (other / "ranks" / "run" / "attempt_0" / "0" / "error.json").write_text(ERROR, "utf-8")
    return other


def test_a_linked_stacks_folder_gives_no_stacks(tmp_path: Path) -> None:
    other, attempt = _elsewhere(tmp_path), tmp_path / "attempt"
    attempt.mkdir()
    (attempt / "stacks").symlink_to(other / "stacks")

    assert rankstacks.read_stacks(other) != () and rankstacks.read_stacks(attempt) == ()


def test_linked_error_file_folders_give_no_error_files_at_any_level(tmp_path: Path) -> None:
    other = _elsewhere(tmp_path)
    assert len(torchrun.error_files(other)) == 2
    for linked in ("torchelastic", "ranks", "ranks/run", "ranks/run/attempt_0", "ranks/run/attempt_0/0"):
        attempt = tmp_path / f"attempt-{linked.replace('/', '-')}"
        (attempt / linked).parent.mkdir(parents=True)
        (attempt / linked).symlink_to(other / linked)

        assert torchrun.error_files(attempt) == (), linked


def test_a_hard_linked_stack_file_is_not_read(tmp_path: Path) -> None:
    host = tmp_path / "host-file"
    host.write_text(py_spy_dump(2048, where="secret_function (secret.py:1)"), "utf-8")
    attempt = tmp_path / "attempt"
    (attempt / "stacks").mkdir(parents=True)
    os.link(host, attempt / "stacks" / "rank-0.txt")
    write_index(attempt, {0: "rank-0.txt"})

    (stack,) = rankstacks.read_stacks(attempt)

    assert stack.threads == () and stack.absent
