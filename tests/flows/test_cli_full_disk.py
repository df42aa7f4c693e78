"""Storage faults under `trainguard run`: a real 2 MB tmpfs fills up, checkpoints come out empty.

The work and evidence folders live on a tmpfs mounted by the test (we run as root in CI); where
mounting is not allowed the test says so and skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from flow_helpers import tiny_spec

ROOT = Path(__file__).resolve().parents[2]
FILLS_THE_DISK = """
import sys
chunk = ("x" * 1023 + "\\n") * 1024
for _ in range(5):  # 5 MB, more than the 2 MB disk holds
    sys.stdout.write(chunk)
sys.stdout.flush()
print("Traceback (most recent call last):")
print('  File "train.py", line 9, in <module>')
print("TypeError: unsupported operand type(s) for +: 'int' and 'str'")
raise SystemExit(1)
"""


def trainguard(*args: str, cwd: Path, api_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "200"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return subprocess.run([sys.executable, "-m", "trainguard.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.fixture
def small_disk(tmp_path: Path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 2 MB tmpfs here (needs root and mount rights): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_code_error_on_a_full_disk_stays_a_code_error_and_the_storage_failure_is_shown(prefect_server, small_disk):
    (small_disk / "train.py").write_text(FILLS_THE_DISK)
    (small_disk / "run.yaml").write_text(yaml.safe_dump({"name": "full-disk", "command": [sys.executable, "train.py"],
                                                         "retry": {"delay_seconds": 0}}))

    result = trainguard("run", "run.yaml", cwd=small_disk, api_url=prefect_server)

    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    table = result.stdout[result.stdout.index("trainguard run full-disk-"):]
    assert "code_error" in table and "unknown" not in table, table
    assert "TypeError: unsupported operand" in table
    assert "log file write failed" in result.stdout and "No space left on device" in result.stdout
    assert "attempt 2" not in table.lower()  # a code error is not retried


def test_resume_never_picks_an_empty_checkpoint(prefect_server, tmp_path):
    # attempt 1 saves good checkpoints, then leaves a 0-byte newest one and dies of an NCCL timeout
    spec = tiny_spec("empty-ckpt", "--fail-at-step", "25", "--fail-on-attempt", "1")
    wrapper = tmp_path / "wrap.py"
    wrapper.write_text(
        "import os, subprocess, sys\n"
        "code = subprocess.call(sys.argv[1:])\n"
        "if code and os.environ['TRAINGUARD_ATTEMPT'] == '1':\n"
        "    open(os.path.join(os.environ['TRAINGUARD_CHECKPOINT_DIR'], 'step-000030.json'), 'w').close()\n"
        "sys.exit(code)\n"
    )
    spec["command"] = [sys.executable, str(wrapper), *spec["command"]]
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))

    result = trainguard("run", "run.yaml", cwd=tmp_path, api_url=prefect_server)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = result.stdout[result.stdout.index("trainguard run empty-ckpt-"):]
    assert "step-000020.json" in table and "step-000030.json" not in table, table
    run_id = table.split()[2]
    verdict = json.loads((tmp_path / "trainguard-data/evidence/runs" / run_id / "attempt-1/verdict.json").read_text())
    assert verdict["decision"]["resume_from"].endswith("step-000020.json")
