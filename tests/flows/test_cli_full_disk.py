"""Storage faults under `trainguard run`: a real 2 MB tmpfs fills up, checkpoints come out empty.

The work and evidence folders live on a tmpfs mounted by the test (tests/conftest.py `small_disk`;
we run as root in CI); where mounting is not allowed the test says so and skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from flow_helpers import cells, tiny_spec
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from typer.testing import CliRunner

from tasks.report import artifact_key
from trainguard.cli import app

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


def test_a_code_error_on_a_full_disk_stays_a_code_error_and_the_storage_failure_is_shown(prefect_server, small_disk):
    (small_disk / "train.py").write_text(FILLS_THE_DISK)
    (small_disk / "run.yaml").write_text(yaml.safe_dump({"name": "full-disk", "command": [sys.executable, "train.py"],
                                                         "retry": {"delay_seconds": 0}}))

    result = trainguard("run", "run.yaml", cwd=small_disk, api_url=prefect_server)

    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    table = result.stdout[result.stdout.index("trainguard run full-disk-"):]
    assert "code_error" in table and "unknown" not in table, table
    assert "TypeError: unsupported operand" in cells(table, "signature"), table
    assert "attempt 2" not in table.lower()  # a code error is not retried
    # the storage failure is in the table, in the final lines, and in the report a person opens first
    evidence = cells(table, "evidence")
    assert "STORAGE FAILED: log file write failed" in evidence and "No space left on device" in evidence, table
    ending = table[table.index("Failed: "):]
    assert "storage failed in attempt 1: log file write failed" in ending
    assert "storage failed in attempt 1: runner.json could not be written: [Errno 28]" in ending
    run_id = table.split()[2]
    with get_client(sync_client=True) as client:
        reports = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[f"{artifact_key(run_id)}-report"])))
    assert "**Storage failed**" in reports[0].data and "No space left on device" in reports[0].data, reports[0].data
    assert "x" * 2000 not in result.stderr  # the failed state's log line carries no 200-line output tail
    verdict_errors = [line for line in result.stderr.splitlines() if "record_verdict" in line and "ERROR" in line]
    assert not verdict_errors and "EvidenceNotFound" not in result.stderr, verdict_errors  # it reports, never raises

    # the manifest was written into the space set aside before the attempt filled the disk
    shown = CliRunner().invoke(app, ["evidence", "show", run_id, "--root", str(small_disk / "trainguard-data/evidence")])
    assert shown.exit_code == 0, shown.output
    assert "attempt 1 (partial:" in shown.output and "verdict.json" in shown.output
    assert "code_error (code.exception)" in shown.output
    kept = json.loads((small_disk / "trainguard-data/evidence/runs" / run_id / "attempt-1/manifest.json").read_text())
    why = {item["name"]: item["reason"] for item in kept["missing"]}
    assert "No space left on device" in why["crash-tail.txt"]
    assert why["runner.json"].startswith("runner.json could not be written: [Errno 28]")


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


def test_evidence_show_of_a_run_whose_evidence_could_not_be_stored_points_at_its_work_folder(tmp_path):
    # what a disk full before the attempt even started leaves: work files, and no evidence folder at all
    attempt = tmp_path / "trainguard-data/work/runs/full-disk-0badc0de/attempt-1"
    (attempt / "logs").mkdir(parents=True)
    (attempt / "logs/train.log").write_text("step 1\n")
    (attempt / "process.json").write_text("{}")

    shown = CliRunner().invoke(app, ["evidence", "show", "full-disk-0badc0de", "--root",
                                     str(tmp_path / "trainguard-data/evidence"), "--work", str(tmp_path / "trainguard-data/work")])

    assert shown.exit_code == 1, shown.output
    assert "attempt-1: nothing was stored (no manifest)" in shown.output
    assert "not stored: logs/train.log" in shown.output and "not stored: process.json" in shown.output
    assert "no evidence for run" not in shown.output
