"""`./dev run` as a user types it: the checkout's venv comes first on the PATH of the commands it runs."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_dev_run_finds_torchrun_in_the_checkouts_venv_without_it_on_the_callers_path(prefect_server, tmp_path):
    stamp = (ROOT / ".venv" / ".trainguard-installed").read_text().split()
    # ./dev test installed the test set (torch included) before the suite: ./dev run installs nothing here
    assert stamp == [hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest(), "test"], stamp
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump({"name": "finds-torchrun", "command": ["torchrun", "--help"],
                                    "retry": {"max_attempts": 1}}))
    env = {**os.environ, "PATH": "/usr/bin:/bin", "PREFECT_API_URL": prefect_server,
           "TRAINGUARD_HOME": str(tmp_path / "home"), "COLUMNS": "200"}

    result = subprocess.run([str(ROOT / "dev"), "run", str(spec)], env=env, capture_output=True, text=True,
                            timeout=240)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Completed: finds-torchrun-" in result.stdout
    logs = list((tmp_path / "home" / "work" / "runs").glob("*/attempt-1/logs/*.log"))
    assert any("usage: torchrun" in log.read_text(errors="replace") for log in logs), logs
