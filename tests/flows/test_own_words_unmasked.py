"""trainguard's own messages are never masked: only secret values are.

Every message below is written with no secret in the environment or the spec, so a `***` in any of
them can only be the masker eating trainguard's own wording (its help reads like an assignment:
``secret_env: {WANDB_API_KEY: 'env:VARIABLE'}``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainguard.core.attempt import AttemptSummary
from trainguard.core.policy import RetryDecision
from trainguard.core.reports.attempt import render_attempt, render_table
from trainguard.core.spec import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[2]

SPECS = [
    {"name": "bad", "command": ["python"], "env": {"WANDB_API_KEY": "abcdefabcdef1234"}},
    {"name": "bad", "command": ["python"], "env": {"HF_TOKEN": "hf_" + "a" * 34}},
    {"name": "bad", "command": ["python", "train.py", "--password", "hunter2hunter2"]},
    {"name": "bad", "command": ["python"], "secret_env": {"HF_TOKEN": "Not A Block"}},
    {"name": "bad", "command": ["python"], "secret_env": {"HF_TOKEN": "env:1BAD"}},
    {"name": "bad", "comand": ["python"]},
    {"name": "bad", "command": ["python"], "stall_secs": 3},
    {"name": "bad", "command": ["python"], "retry": {"host_oom_memory_factor": 2}},
]


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not any(s in k.upper() for s in ("TOKEN", "KEY", "SECRET", "PASS"))}
    return {**env, "PYTHONPATH": str(ROOT), "COLUMNS": "300", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _cli(*args: str, cwd: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "trainguard.cli", *args], cwd=cwd, env=_environment(),
                            capture_output=True, text=True, timeout=120)
    return result.stdout + result.stderr


@pytest.mark.parametrize("spec", SPECS)
def test_no_spec_error_masks_its_own_wording(tmp_path, spec):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    said = _cli("run", "run.yaml", cwd=tmp_path)
    assert "error:" in said and "***" not in said, said
    if "WANDB_API_KEY" in str(spec):
        assert "secret_env: {WANDB_API_KEY: <Prefect Secret block name>} or {WANDB_API_KEY: 'env:VARIABLE'}" in said


def test_help_texts_and_empty_listings_are_not_masked(tmp_path):
    env = {"TRAINGUARD_HOME": str(tmp_path / "home")}
    os.environ.update(env)  # the subprocesses inherit the data root through _environment
    try:
        for args in (["--help"], ["run", "--help"], ["evidence", "--help"], ["fleet", "--help"], ["runs", "--help"],
                     ["classify", "--help"], ["dump", "--help"], ["runs"], ["evidence", "list"], ["fleet"],
                     ["evidence", "show", "no-such-run"], ["run", "missing.yaml"]):
            said = _cli(*args, cwd=tmp_path)
            assert said.strip() and "***" not in said, (args, said)
    finally:
        os.environ.pop("TRAINGUARD_HOME", None)


def test_report_text_of_a_failed_attempt_is_not_masked():
    summary = AttemptSummary(
        run_id="r-1", attempt=1, max_attempts=3, state="Failed", category="config_error", retryable=False,
        signature="KeyError: 'WANDB_API_KEY'", strength="cause",
        remediation="set WANDB_API_KEY through secret_env: {WANDB_API_KEY: 'env:VARIABLE'}",
        decision=RetryDecision(retry=False, reason="config_error is not retryable"))
    for text in (render_attempt(summary), render_table([summary])):
        assert "***" not in text, text
    for spec in SPECS:
        with pytest.raises(SpecError) as caught:
            parse_spec(spec, "run.yaml")
        assert "***" not in str(caught.value)
