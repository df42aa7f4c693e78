"""Culprits and victims in real multi-rank output, and the root cause across two nodes.

Every log and error file here was printed by a real run of PyTorch 2.13 (DDP over gloo on the
CPU, two torchrun agents on loopback standing in for two nodes of two ranks each) of
``tests/pytorch/scripts/train_ddp.py``, recorded by ``tests/pytorch/record.py matrix``: each fault
kind, with the culprit on either node, at the first training step or a later one. The culprit is
expected wherever the evidence names it; where every rank's own error is a lost peer (a hang, a
desynchronised collective) it is undetermined, and where every rank failed the same way at once
(a non-finite gradient norm all-reduced to all) only the category is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category
from trainguard.core.triage.decide import scanner_for
from trainguard.core.triage.torchrun import read_report

RECORDED = Path(__file__).parent / "recorded" / "two_nodes.jsonl"
ROWS = [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]
NAMED = [row for row in ROWS if row["rank"] is not None]
CLOSING = ((re.compile(r"Sending process (\d+) closing signal SIG\w+"), 1),)


def files_of(part: dict[str, Any]) -> tuple[triage.ErrorFile, ...]:
    found = [triage.parse_error_file(f["content"], source=f["source"])
             for f in part["error_files"]]
    if part["agent_error"]:
        found.append(triage.parse_error_file(part["agent_error"], source="agent-error.json"))
    return tuple(f for f in found if f is not None)


def parts_of(row: dict[str, Any], error_files: bool = True) -> list[triage.Part]:
    return [triage.Part(triage.Signals(exit_code=p["exit_code"], log=p["log"],
                                       error_files=files_of(p) if error_files else ()),
                        index=p["index"], node=p["node"], ranks=range(*p["ranks"]))
            for p in row["parts"]]


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_the_root_cause_across_two_nodes_is_the_culprit_wherever_the_evidence_allows(
        row: dict[str, Any]) -> None:
    for error_files in (True, False):
        parts = parts_of(row, error_files)
        for order in (parts, parts[::-1]):
            verdict = triage.root_cause(order)
            assert verdict is not None
            d = verdict.diagnosis
            assert (d.category.value, d.retryable) == (row["category"], row["retryable"]), d
            root = verdict.root_cause
            if row["rank"] is not None:
                assert (root.index, root.rank) == (row["rank"] // 2, row["rank"]), verdict
                assert not d.culprit_undetermined and d.rank == row["rank"]
                assert row["rank"] not in {v.rank for v in verdict.victims}
            elif row["fault"] in ("hang", "desync"):
                assert d.culprit_undetermined and (root.index, root.rank) == (None, None)
                assert {v.index for v in verdict.victims} == {0, 1}
            else:
                assert not d.culprit_undetermined


@pytest.mark.parametrize("row", NAMED, ids=[row["id"] for row in NAMED])
def test_alone_the_healthy_node_shows_only_victims_and_the_failing_node_its_culprit(
        row: dict[str, Any]) -> None:
    culprit_node = row["rank"] // 2
    for part in row["parts"]:
        d = triage.classify(triage.Signals(exit_code=part["exit_code"], log=part["log"]))
        assert d is not None
        if part["index"] == culprit_node:
            assert (d.rank, d.category.value) == (row["rank"], row["category"]), d
        else:
            assert d.culprit_undetermined and d.rank is None, d
            assert (d.category, d.retryable) == (Category.NCCL_ERROR, True)


def test_the_healthy_nodes_report_names_an_innocent_rank_as_its_root_cause() -> None:
    row = next(r for r in NAMED if r["fault"] == "shape" and r["rank"] == 2)
    healthy = next(p for p in row["parts"] if p["index"] == 0)
    report = read_report(healthy["log"].splitlines(), 1, CLOSING)
    roots = [f for f in report.failures if f.root_cause]
    assert len(roots) == 1 and roots[0].rank in (0, 1)
    assert "Connection closed by peer" in roots[0].message
    others = [f for f in report.failures if not f.root_cause]
    assert all(f.pid in report.closed and f.exitcode == -15 for f in others if f.signalled)


def test_the_report_gives_each_line_its_global_rank_and_time() -> None:
    row = next(r for r in NAMED if r["fault"] == "sigkill" and r["rank"] == 2)
    failing = next(p for p in row["parts"] if p["index"] == 1)
    explanation = triage.explain(triage.Signals(exit_code=1, log=failing["log"]))
    d = explanation.diagnosis
    assert d is not None and (d.rule_id, d.rank, d.category) == ("unknown.sigkill", 2,
                                                                  Category.UNKNOWN)
    assert d.failed_at is not None
    sigkill = [e for e in explanation.evidence if e.rule_id == "unknown.sigkill"]
    # the agent's 'failed (exitcode: -9) local_rank: 0 (pid: N)' names local rank 0: rank 2
    assert sigkill and {e.rank for e in sigkill} == {2}
    assert [(v.rank, v.rule_id) for v in d.victims] == [(3, "torchrun.closing_signal")]


def test_a_tee_prefix_names_the_local_rank_and_the_rank_prefix_the_global_one() -> None:
    row = next(r for r in NAMED if r["fault"] == "shape" and r["rank"] == 2)
    failing = next(p for p in row["parts"] if p["index"] == 1)
    line = next(x for x in failing["log"].splitlines() if "mat1 and mat2" in x)
    assert line.startswith("[default0]:[rank2]:")
    hits = scanner_for(triage.load_rules(), "re").scan(line.encode() + b"\n").hits
    assert {h.line.rank for h in hits} == {2}


def test_the_error_file_is_the_ranks_own_account_with_its_time() -> None:
    row = next(r for r in NAMED if r["fault"] == "data" and r["rank"] == 1)
    node = next(p for p in row["parts"] if p["index"] == 0)
    agent = triage.parse_error_file(node["agent_error"])
    assert agent is not None and agent.agent_copy and agent.exit_code == 1
    assert agent.message.startswith("FileNotFoundError:") and agent.timestamp
    assert agent.traceback.startswith("Traceback (most recent call last):")
    worker = next(f for f in node["error_files"] if f["rank"] == 1)
    own = triage.parse_error_file(worker["content"], source=worker["source"])
    assert own is not None and not own.agent_copy and own.message == agent.message
    assert triage.local_rank_of(worker["source"]) == 1
    # Evidence of the rank it names, without any log.
    d = triage.classify(triage.Signals(exit_code=1, error_files=(
        triage.parse_error_file(worker["content"], rank=1),)))
    assert d is not None and (d.category, d.rank, d.failed_at) == (
        Category.DATA_ERROR, 1, own.timestamp)
    assert d.line_number is None


@pytest.mark.parametrize("content", ["", "\n", "not json", "[]", '{"message": {}}'])
def test_an_empty_or_foreign_error_file_records_no_error(content: str) -> None:
    # torchelastic leaves the file empty when the worker died of a signal.
    assert triage.parse_error_file(content) is None


def test_a_sigkilled_rank_leaves_no_error_file() -> None:
    row = next(r for r in NAMED if r["fault"] == "sigkill" and r["rank"] == 1)
    node = next(p for p in row["parts"] if p["index"] == 0)
    assert node["agent_error"] is None
    assert 1 not in {f["rank"] for f in node["error_files"]}


def test_an_older_report_without_time_or_host_is_read_too() -> None:
    # x-001 (a public issue): torchrun's report as torch 2.0 printed it, cut at its last field.
    corpus = Path(__file__).parent / "corpus" / "issues.jsonl"
    row = next(json.loads(line) for line in corpus.read_text().splitlines()
               if json.loads(line)["id"] == "x-001")
    report = read_report(row["log"].splitlines(), 1, CLOSING)
    [failure] = report.failures
    assert (failure.rank, failure.local_rank, failure.exitcode, failure.pid) == (0, 0, -9, 8180)
    assert failure.root_cause and failure.at is None and failure.signalled
    assert failure.message == "Signal 9 (SIGKILL) received by PID 8180"
    assert report.closed == {} and report.closed_by_agent(failure) is None
