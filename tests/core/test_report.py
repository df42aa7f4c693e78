"""The attempt report's rows that come from the platform: the node is untrusted text like the rest."""

from __future__ import annotations

from trainguard.core.attempt import AttemptSummary
from trainguard.core.policy import RetryDecision
from trainguard.core.reports.attempt import render_attempt


def test_the_report_names_the_node_escaped_and_says_when_the_next_attempt_avoids_it() -> None:
    node = "gpu-7<img src=x onerror=alert(1)>|[x](javascript:1)"
    failed = AttemptSummary(run_id="r", attempt=1, max_attempts=3, state="Failed", category="gpu_fault", node=node,
                            decision=RetryDecision(retry=True, avoid_nodes=(node,), reason="retry elsewhere"))
    report = render_attempt(failed)
    row = next(line for line in report.splitlines() if line.startswith("| node |"))
    assert row == (r"| node | gpu-7&lt;img src=x onerror=alert\(1\)&gt;\|\[x\]\(javascript:1\) "
                   "(the next attempt avoids it) |")
    plain = AttemptSummary(run_id="r", attempt=2, max_attempts=3, state="Completed", node="gpu-node-2")
    assert "| node | gpu-node-2 |" in render_attempt(plain).splitlines()
    assert "| node | - |" in render_attempt(AttemptSummary(run_id="r", attempt=1, max_attempts=1, state="Failed"))


def test_how_sure_a_call_is_is_said_in_words_a_user_knows_never_as_a_rule_strength_name() -> None:
    from trainguard.core.reports.attempt import certainty

    def sure(**fields: object) -> str:
        return certainty(AttemptSummary(run_id="r", attempt=1, max_attempts=3, state="Failed", **fields))

    assert sure(category="cuda_oom", strength="cause") == "judged from a root-cause line in the log: strong"
    assert sure(category="preempted", strength="verdict").startswith("judged from what the platform reported")
    assert sure(category="hang", strength="cause", decided_by="stacks").startswith("judged from every rank's stack")
    assert sure(category="unknown", strength="none") == ""  # nothing to say rather than a made-up word
    assert sure(category="code_error", strength="hint", weak=True).startswith("weak call")
    for strength in ("verdict", "cause", "error", "crash", "consequence"):
        said = sure(category="code_error", strength=strength)
        assert said.startswith("judged from") and "strength" not in said


def test_a_long_path_in_the_attempts_table_can_wrap_where_the_ui_would_clip_it() -> None:
    import re

    from trainguard.core.reports.attempt import render_table

    folder = "/srv/shared/trainguard-data/evidence/runs/resnet-nightly-880a1f46/attempt-1"
    summary = AttemptSummary(run_id="resnet-nightly-880a1f46", attempt=1, max_attempts=3, state="Failed",
                             evidence=folder)
    row = render_table([summary]).splitlines()[-1]

    words = re.split(r"[\s\u200b]+", row)
    assert max(len(word) for word in words) <= 40, words  # every word fits a narrow column
    assert folder.replace("-", "\\-") in row.replace("\u200b", "") or folder in row.replace("\u200b", "")


def test_the_attempt_cell_and_heading_show_what_the_attempt_spent_of_the_budget() -> None:
    from trainguard.core.policy import AttemptRecord, RetryPolicy, decide_retry
    from trainguard.core.reports.attempt import attempt_cell
    from trainguard.core.taxonomy import Category

    moved = AttemptRecord(7, Category.NCCL_ERROR, True, "fp", resumed_from="c/step-60.json",
                          newest_checkpoint="c/step-70.json")
    decision = decide_retry(RetryPolicy(max_total_attempts=10), [moved], ["c/step-70.json", "c/step-60.json"])
    summary = AttemptSummary(run_id="r", attempt=7, max_attempts=3, state="Failed", category="nccl_error",
                             decision=decision)
    assert attempt_cell(summary) == "7/10 (0/3 no progress)"
    assert render_attempt(summary).startswith(
        "# r: attempt 7 failed: nccl\\_error (0 of 3 in a row without checkpoint progress, 7 of 10 in all)")
    # a verdict decided when the budget counted attempts in all keeps its own form; a success shows its number
    older = AttemptSummary.from_dict({"run_id": "r", "attempt": 2, "max_attempts": 3, "state": "Failed",
                                      "decision": {"budget": 3}})
    assert attempt_cell(older) == "2/3"
    assert attempt_cell(AttemptSummary(run_id="r", attempt=8, max_attempts=3, state="Completed")) == "8"
