"""The short crash summary the entrypoint leaves in the termination-message file.

The entrypoint runs as its own process, as in a container: in-process it would make the test's
process a subreaper, reap that process's other children and end them as its descendants (the
session's Prefect server among them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from entrypoint_harness import entrypoint_env

from trainguard_entrypoint.termination import LIMIT_BYTES, summary


def _entrypoint(argv: list[str], env: dict[str, str]) -> int:
    return subprocess.run([sys.executable, "-m", "trainguard_entrypoint", *argv], timeout=60, capture_output=True,
                          env=entrypoint_env(env, path="/usr/bin:/bin")).returncode


def test_a_failed_command_leaves_a_small_json_summary_with_its_last_lines(tmp_path: Path) -> None:
    term = tmp_path / "termination-log"
    script = "print('step 1'); print('token https://u:hunter2@example.com/x'); raise SystemExit(3)"
    code = _entrypoint(["--workspace", str(tmp_path / "ws"), "--run-id", "r1", "--attempt", "1",
                        "--termination-log", str(term), "--", sys.executable, "-c", script], {})
    data = json.loads(term.read_bytes())
    assert code == 3 and data["exit_code"] == 3 and data["trainguard"] == 1
    assert data["crash_report"].endswith("crash-report.json")
    assert data["log_tail"][-2:] == ["step 1", "token https://u:***@example.com/x"]


def test_the_environment_variable_names_the_file_too(tmp_path: Path) -> None:
    term = tmp_path / "t"
    _entrypoint(["--", sys.executable, "-c", "pass"], {
        "TRAINGUARD_WORKSPACE": str(tmp_path / "ws"), "TRAINGUARD_RUN_ID": "r",
        "TRAINGUARD_ATTEMPT": "2", "TRAINGUARD_TERMINATION_LOG": str(term)})
    assert json.loads(term.read_bytes())["exit_code"] == 0


def test_huge_lines_are_clipped_to_the_kubelet_limit() -> None:
    report = {"exit_code": 1, "log_tail": ["\x1b[31m" + "x" * 100_000 + "\u2603"] * 50}
    data = summary(report, Path("/w/crash-report.json"))
    assert len(data) <= LIMIT_BYTES and json.loads(data)["log_tail"]


def test_a_password_cut_by_the_clipping_is_not_shown() -> None:
    line = "x" * 280 + " https://user:hunter2hunter2@example.com"
    data = json.loads(summary({"exit_code": 1, "log_tail": [line]}, Path("/r")))
    assert "hunter" not in json.dumps(data)
