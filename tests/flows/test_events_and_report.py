"""Events users automate on, and the run report a person opens first, from real runs.

Runs go through the training-run flow against the session's Prefect server with real processes;
the events are read back from the server's own event store, the report from its artifacts.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from flow_helpers import ROOT, run, tiny_spec
from prefect import get_client
from prefect.artifacts import Artifact
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.events.worker import EventsWorker
from waiting import wait_for

from flows import events
from trainguard.core.attempt import AttemptSummary
from trainguard.core.policy import RetryDecision

HOSTILE = (
    "import sys\n"
    "for step in range(1, 6): print(f'step {step}/5 loss {1 / step:.3f}', flush=True)\n"
    "print('<script>alert(1)</script> | ## not a heading | **bold** [x](javascript:alert(1)) `tick` '"
    " + 'A' * 1_000_000, flush=True)\n"
    "print('Traceback (most recent call last):\\nTypeError: <img src=x onerror=alert(1)> | broken | row')\n"
    "sys.exit(1)\n"
)


@pytest.fixture(autouse=True)
def events_to_this_server(blocks):
    """Prefect keeps one events worker per process, bound to the server it first sent to; on a test
    worker that ran another folder's server (or fault proxy) first, start it afresh for this one."""
    EventsWorker.drain_all(timeout=5)
    yield


def events_of(run_id: str) -> dict[str, dict]:
    with get_client(sync_client=True) as client:
        page = client.read_events(EventFilter(event=EventNameFilter(prefix=["trainguard."]),
                                              resource=EventResourceFilter(id=[f"trainguard.run.{run_id}"])), limit=50)
    return {event.event: event for event in page.events}


def test_a_run_that_gives_up_emits_labelled_attempt_and_run_events(blocks):
    spec = tiny_spec("events-fail", "--fail-at-step", "15", "--failure", "type-error", gpus=2)
    state, _ = run(spec, blocks, "events-fail-1")
    assert state.is_failed()

    found = wait_for(lambda: (e := events_of("events-fail-1")) and len(e) == 2 and e, 60, "both events")
    assert set(found) == {"trainguard.attempt.finished", "trainguard.run.gave-up"}
    labels = dict(found["trainguard.run.gave-up"].resource.root)
    assert labels["trainguard.category"] == "code_error" and labels["trainguard.retryable"] == "false"
    assert labels["trainguard.run-id"] == "events-fail-1" and labels["trainguard.attempt"] == "1"
    assert labels["trainguard.rule-id"] not in ("", "none") and labels["trainguard.node"] not in ("", "unknown")
    assert float(labels["trainguard.gpu-seconds"]) > 0
    related = {r.id for r in found["trainguard.attempt.finished"].related}
    assert any(r.startswith("prefect.flow-run.") for r in related)


def test_a_run_that_succeeds_emits_run_succeeded(blocks):
    state, _ = run(tiny_spec("events-ok"), blocks, "events-ok-1")
    assert state.is_completed()
    found = wait_for(lambda: (e := events_of("events-ok-1")) and len(e) == 2 and e, 60, "both events")
    assert set(found) == {"trainguard.attempt.finished", "trainguard.run.succeeded"}
    assert found["trainguard.run.succeeded"].resource["trainguard.retryable"] == "false"


def test_the_run_report_has_a_timeline_and_chart_and_hostile_log_text_cannot_break_it(blocks):
    # nccl_error gets a budget of its own, below the run's 3: every view must count against it
    spec = tiny_spec("hostile", "--fail-at-step", "25", "--fail-on-attempt", "1",
                     retry={"overrides": {"nccl_error": {"max_attempts": 2}}})
    state, _ = run(spec, blocks, "hostile-1")
    assert state.is_completed()
    report = Artifact.get("hostile-1-report").data
    assert "# Run hostile-1: succeeded on attempt 2" in report
    timeline = [line for line in report.splitlines() if line.startswith(("| 1 ", "| 2 "))]
    rows = Artifact.get("hostile-1-attempts").data
    table = [row["attempt"] for row in (json.loads(rows) if isinstance(rows, str) else rows)]
    assert [line.split(" | ")[0].removeprefix("| ") for line in timeline] == table and table[0] == "1 (0/2 no progress)"
    # attempt 1 saved checkpoints before failing, so it spent none of the budget
    assert "attempt 1 failed: nccl\\_error (0 of 2 in a row without checkpoint progress)" in \
        Artifact.get("hostile-1-attempt-1").data
    assert "**Failed**" in timeline[0] and "nccl\\_error" in timeline[0] and "**Completed**" in timeline[1]
    assert "step-000020.json" in timeline[1]  # the checkpoint attempt 2 resumed from
    assert "resuming from step-000020.json" in timeline[0] and "/checkpoints/" not in timeline[0]
    chart = report.split("```text", 1)[1].split("```", 1)[0]
    assert re.search(r"a1\s+█+·+ ✗ steps \d+→25", chart) and re.search(r"a2\s+·+█+ ✓ steps 2\d→40", chart)
    assert "loss" in chart

    bad = {"name": "hostile-log", "command": [sys.executable, "-c", HOSTILE]}
    state, _ = run(bad, blocks, "hostile-2")
    assert state.is_failed()
    report = Artifact.get("hostile-2-report").data
    assert "<script>" not in report and "<img" not in report and "](javascript" not in report
    assert len(report) < 20_000 and max(len(line) for line in report.splitlines()) < 2_000
    tables = [[row for row in block.splitlines() if row.startswith("| ")] for block in report.split("\n\n")]
    widths = [{_cells(row) for row in rows} for rows in tables if rows]  # each table: one width for all its rows
    assert widths[0] == {8} and all(len(w) == 1 for w in widths), widths  # no pipe from the log split or added a column
    assert "```text" in report and report.count("```") == 2


def _cells(row: str) -> int:
    return len(re.split(r"(?<!\\)\|", row.strip())) - 2


class _Webhook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (the http.server spelling)
        self.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_the_documented_automation_notifies_about_a_run_that_gave_up_on_a_non_retryable_failure(prefect_server):
    """The Prefect operations page's example, executed as written, against a webhook on loopback (not Slack)."""
    readme = (ROOT / "docs" / "platform" / "prefect.md").read_text()
    example = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S)
                   if "notify on non-retryable failures" in block)
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    block_id = CustomWebhookNotificationBlock(
        name="readme", url=f"http://127.0.0.1:{hook.server_port}/hook",
        json_data={"subject": "{{subject}}", "body": "{{body}}"}).save("readme-example", overwrite=True)
    exec(compile(example, "docs/platform/prefect.md", "exec"), {"SLACK_WEBHOOK_BLOCK_ID": block_id})  # noqa: S102
    try:
        with get_client(sync_client=True) as client:
            wait_for(lambda: client.read_automations_by_name("notify on non-retryable failures"), 30, "the automation")
        gave_up = AttemptSummary(run_id="readme-1", attempt=1, max_attempts=3, state="Failed", category="code_error",
                                 retryable=False, rule_id="python.traceback", gpus=2, duration_seconds=30,
                                 decision=RetryDecision(retry=False, reason="code_error is not retryable"))
        events.report_attempt(gave_up, gave_up.to_dict())  # the attempt's event, then the run's: it gave up
        got = wait_for(lambda: _Webhook.received, 60, "the notification on the loopback webhook")[0]
        assert got["subject"] == "readme-1 gave up"
        assert got["body"].startswith("code_error (python.traceback) after 60.0 GPU-seconds: code_error is not retryable")
    finally:
        hook.shutdown()
        with get_client(sync_client=True) as client:
            for automation in client.read_automations_by_name("notify on non-retryable failures"):
                client.delete_automation(automation.id)
