"""`./dev run` as a user types it: the checkout's venv comes first on the PATH of the commands it runs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import venv
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


def test_dev_run_of_a_torch_spec_without_torch_says_so_naming_the_fix_and_the_path_searched(prefect_server, tmp_path):
    # a checkout whose venv holds the light set: a bare venv (no torchrun in it) with trainguard's
    # command beside it, as the light install leaves it
    checkout = tmp_path / "checkout"
    (checkout / "examples" / "ddp").mkdir(parents=True)
    for name in ("dev", "pyproject.toml", "examples/ddp/spec-1-node.yaml"):
        shutil.copy2(ROOT / name, checkout / name)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(checkout / ".venv")
    (checkout / ".venv" / "bin" / "trainguard").symlink_to(ROOT / ".venv" / "bin" / "trainguard")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    (checkout / ".venv" / ".trainguard-installed").write_text(f"{digest} light\n")
    env = {**os.environ, "PATH": "/usr/bin:/bin", "PREFECT_API_URL": prefect_server, "COLUMNS": "300"}
    env.pop("TRAINGUARD_HOME", None)

    result = subprocess.run([str(checkout / "dev"), "run", "examples/ddp/spec-1-node.yaml", "--max-attempts", "1"],
                            env=env, capture_output=True, text=True, timeout=240)

    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert ("dev: examples/ddp/spec-1-node.yaml runs torch, which the light set in .venv lacks: add it with "
            ".venv/bin/python -m pip install -e '.[torch]' (./dev test installs it too)") in result.stderr
    said = " ".join(result.stdout.split())
    assert "config_error" in said
    assert f"command not found: torchrun (searched PATH={checkout}/.venv/bin:/usr/bin:/bin)" in " ".join(
        (checkout / "trainguard-data" / "evidence" / "runs").rglob("verdict.json").__next__().read_text().split())
