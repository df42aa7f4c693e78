"""A training log full of markup, HTML, terminal sequences and secrets, run through `trainguard run`.

One real run against the session's Prefect server: the script prints secrets it found in the
worker's environment and crashes with a line of rich markup, Markdown links and HTML. Nothing
trainguard writes or shows may break, inject, or leak a secret because of it; the raw log on the
attempt's own volume is the one place allowed to keep the bytes as printed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.blocks.system import Secret
from prefect import get_client
from prefect.events.filters import EventFilter, EventResourceFilter

from flow_helpers import attempt_runs, cells, prefect_records
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "supersecret123",
    "SLACK_WEBHOOK": "https://hooks.slack.com/services/T0SECRET/B0SECRET/webhooksecret99",
    "HF_TOKEN": "hf_" + "q" * 34,
}
# referenced by the spec's secret_env, resolved only inside the attempt: a Prefect Secret block and a
# worker variable whose name does not look secret (only the reference marks it as one)
BLOCK_SECRET, WORKER_SECRET = "blockvalue-8d41c2", "workervalue-19fa7e"
# a token and a password put on the command line itself: refused before anything is stored
ARGV_TOKEN, ARGV_PASSWORD = "hf_" + "z" * 34, "hunter2hunter2"
NEEDLES = ("supersecret123", "T0SECRET", "webhooksecret99", "hf_" + "q" * 34, BLOCK_SECRET, WORKER_SECRET,
           ARGV_TOKEN, ARGV_PASSWORD)
CRASH = "bad [/] [/red] [x](javascript:alert(1)) <script>alert(1)</script> <img src=x onerror=alert(2)>"
SCRIPT = f"""
import os
print("\\x1b[31mstarting\\x1b[0m\\x1b]0;owned title\\x07")
print("AWS_SECRET_ACCESS_KEY=" + os.environ["AWS_SECRET_ACCESS_KEY"])
print("posting to", os.environ["SLACK_WEBHOOK"], "with", os.environ["HF_TOKEN"])
print("resolved", os.environ["DB_PASSWORD"], os.environ["PLAIN_NAME"])
raise RuntimeError({CRASH!r} + " key " + os.environ["AWS_SECRET_ACCESS_KEY"])
"""


def trainguard(*args: str, cwd: Path, api_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SECRETS, "WORKER_VALUE_7": WORKER_SECRET, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "COLUMNS": "200"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return subprocess.run([sys.executable, "-m", "trainguard.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def hostile_run(prefect_server, tmp_path_factory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "train.py").write_text(SCRIPT)
    Secret(value=BLOCK_SECRET).save("hostile-db-password", overwrite=True)
    spec = {"name": "hostile", "command": [sys.executable, "train.py"], "retry": {"delay_seconds": 0},
            "secret_env": {"DB_PASSWORD": "hostile-db-password", "PLAIN_NAME": "env:WORKER_VALUE_7"}}
    (folder / "run.yaml").write_text(yaml.safe_dump(spec))
    result = trainguard("run", "run.yaml", cwd=folder, api_url=prefect_server)
    run_id = re.search(r"trainguard run (hostile-[0-9a-f]{8})", result.stdout)
    assert run_id, result.stdout[-3000:] + result.stderr[-3000:]
    return {"result": result, "folder": folder, "run_id": run_id.group(1)}


def test_a_crash_line_full_of_markup_prints_literally_in_the_table_and_nothing_crashes(hostile_run) -> None:
    result = hostile_run["result"]

    assert result.returncode == 1, result.stderr[-3000:]
    assert "MarkupError" not in result.stderr, result.stderr[-3000:]
    # a failed training command is an expected outcome: one line, not a traceback of TrainingFailed
    # (the command's own traceback is its output, streamed live through the training task's logger)
    own = [line for line in result.stderr.splitlines() if "Task run 'run_training-" not in line]
    assert not any("Traceback" in line for line in own) and "training ended with Error: exited with code 1" in result.stderr
    assert any("Task run 'run_training-" in line and line.endswith(" - starting") for line in result.stderr.splitlines())
    table = result.stdout[result.stdout.index("trainguard run hostile-"):]
    # the signature column may wrap its text over several lines: read it as one, spaces aside
    signature = "".join(cells(table, "signature").split())
    assert "[/]" in signature and "[/red]" in signature and "[x](javascript:alert(1))" in signature
    assert "code_error" in table and "\x1b" not in table


def test_evidence_show_prints_a_hostile_verdict_literally(hostile_run) -> None:
    shown = trainguard("evidence", "show", hostile_run["run_id"], cwd=hostile_run["folder"])

    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "[/red]" in shown.stdout and "[x](javascript:alert(1))" in shown.stdout
    assert "Traceback" not in shown.stderr


def test_no_secret_reaches_anything_trainguard_wrote_or_showed(hostile_run, prefect_server) -> None:
    folder, run_id = hostile_run["folder"], hostile_run["run_id"]
    raw_log = next((folder / "trainguard-data/work/runs" / run_id / "attempt-1/logs").glob("*.log"))
    assert b"supersecret123" in raw_log.read_bytes()  # the attempt's own volume keeps the raw log
    spec = yaml.safe_load((folder / "run.yaml").read_text())
    spec["command"] += ["--token", ARGV_TOKEN, "--password", ARGV_PASSWORD]
    (folder / "argv.yaml").write_text(yaml.safe_dump({**spec, "name": "hostile-argv"}))
    refused = trainguard("run", "argv.yaml", cwd=folder, api_url=prefect_server)
    (folder / "argv.yaml").unlink()  # the spec file itself is the user's, not something trainguard wrote
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
    assert "command: argument 3 looks like a secret" in refused.stderr and "secret_env" in refused.stderr

    shown = [hostile_run["result"].stdout, hostile_run["result"].stderr, refused.stdout, refused.stderr,
             trainguard("evidence", "show", run_id, cwd=folder).stdout]
    written = [p.read_bytes().decode("utf-8", "replace") for p in folder.rglob("*") if p.is_file() and p != raw_log]
    artifacts, parameters, logs = prefect_records(run_id)
    events = wait_for(lambda: _events(run_id), 30, "the run's events")
    for channel, texts in {"console": shown, "files": written, "artifacts": artifacts, "parameters": parameters,
                           "prefect logs": logs, "events": events}.items():
        for needle in NEEDLES:
            assert not any(needle in text for text in texts), f"{needle} leaked into {channel}"
    assert any("AWS_SECRET_ACCESS_KEY=***" in text for text in written)
    assert any("resolved *** ***" in text for text in written)  # the secret_env values reached the command
    # the output streamed live into the run's logs: masked, without its terminal sequences
    assert "starting" in logs and "AWS_SECRET_ACCESS_KEY=***" in logs


def test_the_report_artifact_escapes_html_and_links_and_fences_the_log_line(hostile_run) -> None:
    artifacts, _, _ = prefect_records(hostile_run["run_id"])
    report = next(text for text in artifacts if text.startswith("# hostile"))

    outside_fences = re.sub(r"(`{3,})text\n.*?\n\1", "", report, flags=re.S)
    assert "<script>" not in outside_fences and "<img" not in outside_fences
    assert "](javascript:" not in outside_fences
    assert "\x1b" not in report
    fenced = re.search(r"(`{3,})text\n(.*?)\n\1", report, flags=re.S)
    assert fenced and "<script>alert(1)</script>" in fenced.group(2)


def test_the_crash_tail_is_stripped_of_terminal_sequences(hostile_run) -> None:
    folder, run_id = hostile_run["folder"], hostile_run["run_id"]
    tail = (folder / "trainguard-data/evidence/runs" / run_id / "attempt-1/crash-tail.txt").read_text()

    assert "\x1b" not in tail and "\x07" not in tail and "starting" in tail


def test_evidence_show_reports_a_deleted_manifest_and_unlisted_files_and_exits_non_zero(hostile_run, tmp_path) -> None:
    root = tmp_path / "evidence"
    shutil.copytree(hostile_run["folder"] / "trainguard-data/evidence", root)
    run_id = hostile_run["run_id"]
    attempt = root / "runs" / run_id / "attempt-1"
    (attempt / "planted.sh").write_text("echo not collected by trainguard")

    unlisted = trainguard("evidence", "show", run_id, "--root", str(root), cwd=tmp_path)
    assert unlisted.returncode == 1
    assert "planted.sh: not in the manifest" in unlisted.stdout, unlisted.stdout

    shutil.copytree(attempt, root / "runs" / run_id / "attempt-2")
    (root / "runs" / run_id / "attempt-2" / "manifest.json").unlink()
    deleted = trainguard("evidence", "show", run_id, "--root", str(root), cwd=tmp_path)
    assert deleted.returncode == 1
    assert "attempt 2: manifest.json is missing" in deleted.stdout, deleted.stdout
    assert "unverified: runs/" in deleted.stdout


def _events(run_id: str) -> list[str]:
    """Every event the server holds about the run or one of its flow runs, as JSON."""
    with get_client(sync_client=True) as client:
        ids = [f"trainguard.run.{run_id}", *(f"prefect.flow-run.{r.id}" for r in attempt_runs(run_id))]
        page = client.read_events(EventFilter(resource=EventResourceFilter(id=ids)), limit=50)
    found = [event.model_dump_json() for event in page.events]
    return found if any('"trainguard.' in text for text in found) else []

