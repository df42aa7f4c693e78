"""The `trainguard` command as users run it: a subprocess against the real test server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from flow_helpers import tiny_spec

ROOT = Path(__file__).resolve().parents[2]


def trainguard(*args: str, cwd: Path, api_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "200"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return subprocess.run([sys.executable, "-m", "trainguard.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"name": "bad", "command": ["python", "t.py"], "retry": {"max_attempts": -1}}, "retry.max_attempts"),
        ({"name": "bad", "env": {"A": "1"}}, "command"),
        ({"name": "bad", "command": "python t.py", "retry": {"overrides": {"gremlins": {"retryable": True}}}},
         "retry.overrides.gremlins: unknown failure category"),
        ({"name": "bad", "command": ["python", "", "t.py"]}, "command: argument 1 is empty"),
        ({"name": "bad", "command": ["python"], "env": {"A=B": "1"}}, "env: 'A=B' is not a variable name"),
        ({"name": "bad", "command": ["python"], "env": {"A": "x\0y"}}, "env: A: the value contains a NUL byte"),
        ({"name": "bad", "command": ["python"], "gpus": True}, "gpus: expected a whole number, got true"),
        ({"name": "bad", "command": ["python"], "deadline_seconds": float("inf")}, "deadline_seconds: must be a finite"),
        ({"name": "bad", "command": ["python"], "env": {"BIG": "x" * 300_000}}, "env: the spec is 300,"),
        ({"name": "bad", "command": ["python"], "env": {"HF_TOKEN": "hf_" + "a" * 34}}, "env: HF_TOKEN: looks like a secret"),
        ({"name": "bad", "command": ["python"], "secret_env": {"HF_TOKEN": "Not A Block"}}, "secret_env: entry HF_TOKEN:"),
    ],
)
def test_a_malformed_spec_gives_one_line_naming_the_field_exits_non_zero_and_writes_nothing(tmp_path, spec, field):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    before = sorted(tmp_path.rglob("*"))

    result = trainguard("run", str(path), cwd=tmp_path)

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert "hf_aaaa" not in result.stderr  # the refusal names the variable, never its value
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_run_prints_the_attempts_table_and_evidence_show_verifies_what_was_kept(prefect_server, tmp_path):
    spec = tiny_spec("cli-run", "--fail-at-step", "25", "--fail-on-attempt", "1")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))

    result = trainguard("run", "run.yaml", cwd=tmp_path, api_url=prefect_server)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = result.stdout[result.stdout.index("trainguard run cli-run-"):]
    assert "nccl_error" in table and "Completed" in table and "Failed" in table
    assert "step-000020.json" in table  # the checkpoint attempt 2 resumed from
    run_id = table.split()[2]
    shown = trainguard("evidence", "show", run_id, cwd=tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "crash-report.json" in shown.stdout and "FAILED" not in shown.stdout
    # a CPU attempt on a host without an NVIDIA driver, that exited rather than dumped core, lacks nothing
    # it could have had: its GPU snapshots and core dumps are "not applicable", and it is not partial
    assert "(partial:" not in shown.stdout and "absent" not in shown.stdout, shown.stdout
    assert "not applicable" in shown.stdout and "nvidia-smi not found" in shown.stdout
    assert "verdict.json" in shown.stdout and "nccl_error (nccl." in shown.stdout

    log = next((tmp_path / "trainguard-data/evidence/runs" / run_id / "attempt-1/logs").glob("*.log"))
    log.write_bytes(log.read_bytes() + b"tampered")
    tampered = trainguard("evidence", "show", run_id, cwd=tmp_path)
    assert tampered.returncode == 1 and "FAILED" in tampered.stdout


def test_submitting_to_a_deployment_that_does_not_exist_is_one_line_naming_it(prefect_server, tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tiny_spec("nowhere")))

    result = trainguard("run", "run.yaml", "--deployment", "train-attempt/missing", cwd=tmp_path, api_url=prefect_server)

    assert result.returncode == 2
    assert "train-attempt/missing" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_table_counts_attempts_against_the_budget_the_retry_message_names(prefect_server, tmp_path):
    # every attempt times out in NCCL after some progress; nccl_error may use only 2 of the run's 3 attempts
    spec = tiny_spec("cli-budget", "--fail-after-steps", "15",
                     retry={"max_attempts": 3, "overrides": {"nccl_error": {"max_attempts": 2}}})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))

    result = trainguard("run", "run.yaml", cwd=tmp_path, api_url=prefect_server)

    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 of 2 attempts used" in result.stdout
    table = result.stdout[result.stdout.index("trainguard run cli-budget-"):]
    assert "2/2" in table and "/3" not in table, table


@pytest.mark.parametrize("text", [
    "name: deep\ncommand: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "name: deep\ncommand: [python]\nenv: " + "{a: " * 100_000 + "b" + "}" * 100_000 + "\n",
    '{"name": "deep", "command": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "name: deep\ncommand:\n" + "".join("  " * depth + "- \n" for depth in range(1, 3000)),
])
def test_a_spec_nested_beyond_reading_gives_one_line_and_writes_nothing(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    before = sorted(tmp_path.rglob("*"))

    result = trainguard("run", str(path), cwd=tmp_path)

    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nested" in lines[0] and str(path) in lines[0], result.stderr[-2000:]
    assert sorted(tmp_path.rglob("*")) == before
