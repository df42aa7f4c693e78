"""The attempt report's rows that come from the platform: the node is untrusted text like the rest."""

from __future__ import annotations

from trainguard.core.attempt import AttemptSummary
from trainguard.core.reports.attempt import render_attempt


def test_the_report_names_the_node_escaped_and_says_when_the_next_attempt_avoids_it() -> None:
    node = "gpu-7<img src=x onerror=alert(1)>|[x](javascript:1)"
    failed = AttemptSummary(run_id="r", attempt=1, max_attempts=3, state="Failed", category="gpu_fault", node=node,
                            decision={"retry": True, "avoid_nodes": [node], "reason": "retry elsewhere"})
    report = render_attempt(failed)
    row = next(line for line in report.splitlines() if line.startswith("| node |"))
    assert row == (r"| node | gpu-7&lt;img src=x onerror=alert\(1\)&gt;\|\[x\]\(javascript:1\) "
                   "(the next attempt avoids it) |")
    plain = AttemptSummary(run_id="r", attempt=2, max_attempts=3, state="Completed", node="gpu-node-2")
    assert "| node | gpu-node-2 |" in render_attempt(plain).splitlines()
    assert "| node | - |" in render_attempt(AttemptSummary(run_id="r", attempt=1, max_attempts=1, state="Failed"))
