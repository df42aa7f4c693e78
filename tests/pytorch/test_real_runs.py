"""Real PyTorch 2.13 failures under torchrun (gloo on the CPU), judged as a new user's would be.

Every message classified here was printed by a real run of ``scripts/`` (see ``pytorch_runs``):
a rank raising a shape error, a TypeError, a non-finite gradient norm, a missing data file, a
truncated checkpoint, a bare SIGKILL, an allocation over a real memory limit, a hang that the
others' gloo timeout ends, a desynchronised collective, crashing DataLoader workers, Lightning
with ModelCheckpoint, and two torchrun agents standing in for two nodes.
"""

from __future__ import annotations

import re

import pytest

from pytorch_runs import SCENARIOS, NodeRun, Run
from trainguard.core import triage

SINGLE_NODE = [name for name, s in SCENARIOS.items() if s.nodes == 1]
# Scenarios whose culprit wrote its own error (a bare SIGKILL leaves its rank's log empty).
CULPRIT_WROTE = [name for name in SINGLE_NODE
                 if SCENARIOS[name].rank is not None and name != "sigkill"]


def error_files(node: NodeRun) -> tuple[triage.ErrorFile, ...]:
    found = [triage.parse_error_file(text, source=path) for path, text in node.error_files.values()]
    if node.agent_error is not None:
        found.append(triage.parse_error_file(node.agent_error, source="agent-error.json"))
    return tuple(e for e in found if e is not None)


def node_signals(node: NodeRun, with_error_files: bool = True) -> triage.Signals:
    return triage.Signals(exit_code=node.returncode, log=node.output,
                          error_files=error_files(node) if with_error_files else ())


def tail(output: bytes) -> str:
    """The end of a run's output, for an assertion's message."""
    return output[-4000:].decode("utf-8", errors="replace")


def reported(node: NodeRun) -> set[int]:
    """The ranks the run says anything of besides their progress: an error file, a line of their own, or
    torchrun's failure report (``rank      : 1 (local_rank: 1)``, for a rank it stopped)."""
    ranks = {rank for rank, (_, text) in node.error_files.items() if text.strip()}
    for line in node.output.decode("utf-8", errors="replace").splitlines():
        own = re.match(r"\[default(\d+)\]:(.*)", line)
        if own and not re.match(r"step \d+ loss", own.group(2)):
            ranks.add(int(own.group(1)))
        elif stopped := re.match(r"\s*rank\s*: (\d+) \(local_rank", line):
            ranks.add(int(stopped.group(1)))
    return ranks


def judged(run: Run, node: int = 0) -> triage.Diagnosis:
    diagnosis = triage.classify(node_signals(run.nodes[node]))
    assert diagnosis is not None
    return diagnosis


@pytest.mark.parametrize("scenario", SINGLE_NODE)
def test_a_real_failure_is_judged_by_its_culprit_not_by_the_ranks_that_lost_it(
        runs, scenario: str) -> None:
    run = runs.get(scenario)
    expected = run.scenario
    assert run.nodes[0].returncode != 0
    d = judged(run)
    assert (d.category.value, d.retryable) == (expected.category, expected.retryable), d
    passed = {v.rank for v in d.victims}
    if expected.rank is not None:
        assert d.rank == expected.rank and not d.culprit_undetermined, d
    if scenario in ("hang", "desync"):
        assert d.culprit_undetermined and d.rank is None, d
        # Every rank the run says anything of only lost a peer. On a loaded machine torchrun may stop a
        # rank while it writes its error file and then die on that empty file before its failure report:
        # that rank left nothing but its progress, so it is neither culprit nor victim.
        assert passed and passed == reported(run.nodes[0]), (d.victims, tail(run.nodes[0].output))
    else:
        assert d.rank is not None and d.rank not in passed, d
    if expected.rank is not None:
        assert passed, "the ranks that only lost the culprit are recorded as passed over"
    # The same verdict from the log alone, without the error files.
    alone = triage.classify(node_signals(run.nodes[0], with_error_files=False))
    assert alone is not None and (alone.category, alone.rank) == (d.category, d.rank)


@pytest.mark.scenarios("shape")
def test_the_survivors_are_passed_over_with_the_reason_and_no_preemption_is_read(runs) -> None:
    shape = runs.get("shape")
    d = judged(shape)
    # what torchrun printed, shown when the order of the ranks' ends was not the usual one
    seen = (d, shape.nodes[0].agent_error, tail(shape.nodes[0].output))
    assert d.category.value == "code_error" and d.rank == 1, seen
    assert [(v.rank, v.rule_id) for v in d.victims] == [(0, "torchrun.closing_signal")], seen
    assert "closing signal (SIGTERM)" in d.victims[0].reason
    explanation = triage.explain(node_signals(runs.get("shape").nodes[0]))
    preempted = [e for e in explanation.evidence if e.category == "preempted"]
    assert all(e.victim for e in preempted), preempted
    assert "passed over as victims: rank 0" in explanation.reason


@pytest.mark.scenarios("sigkill", "memory")
def test_a_bare_sigkill_is_unknown_and_retried_but_a_real_allocation_failure_is_host_oom(
        runs) -> None:
    killed = judged(runs.get("sigkill"))
    assert (killed.category.value, killed.retryable, killed.rank) == ("unknown", True, 1)
    assert killed.rule_id == "unknown.sigkill" and killed.weak
    out_of_memory = judged(runs.get("memory"))
    assert (out_of_memory.category.value, out_of_memory.rank) == ("host_oom", 1)
    assert "can't allocate memory" in out_of_memory.signature


@pytest.mark.scenarios("hang")
def test_a_gloo_timeout_is_a_retryable_communication_failure_worded_as_gloo_said(runs) -> None:
    d = judged(runs.get("hang"))
    assert (d.category.value, d.retryable, d.rule_id) == ("nccl_error", True, "gloo.timeout")
    assert d.signature.startswith("RuntimeError: Timed out waiting"), d.signature
    assert d.remediation.startswith("Culprit undetermined")


# gloo's words for a peer gone, as a survivor raises them when it notices before its agent does
PEER_LOSS = ("Read error", "Connection closed by peer", "Connection reset by peer", "Timed out waiting")


@pytest.mark.scenarios("shape", "sigkill")
def test_torchelastic_writes_the_root_causes_error_and_nothing_for_a_signal_death(runs) -> None:
    shape = runs.get("shape").nodes[0]
    assert shape.agent_error is not None, tail(shape.output)
    agent = triage.parse_error_file(shape.agent_error)
    assert agent is not None and agent.agent_copy and agent.exit_code == 1, (shape.agent_error, tail(shape.output))
    assert agent.message.startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert "Traceback (most recent call last)" in agent.traceback and agent.timestamp
    # The error file alone says what failed; with the log, torchrun's report says which rank.
    alone = triage.classify(triage.Signals(exit_code=1, error_files=(agent,)))
    assert alone is not None and alone.category.value == "code_error" and alone.rank is None
    both = triage.classify(triage.Signals(exit_code=1, log=shape.output, error_files=(agent,)))
    assert both is not None and both.rank == 1 and both.failed_at == agent.timestamp
    killed = runs.get("sigkill").nodes[0]
    assert 1 not in killed.error_files  # the rank killed by a signal writes nothing
    if killed.agent_error is not None:  # a survivor raised on its lost peer before its agent stopped it
        survivor = triage.parse_error_file(killed.agent_error)
        assert survivor is not None and any(loss in survivor.message for loss in PEER_LOSS), survivor


@pytest.mark.parametrize("scenario", CULPRIT_WROTE)
def test_each_ranks_own_log_and_error_file_find_the_culprit_across_ranks(
        runs, scenario: str) -> None:
    run = runs.get(scenario)
    node = run.nodes[0]
    by_file = {path: text for path, text in node.error_files.values()}
    parts = []
    for rank, log in sorted(node.rank_logs.items()):
        files = tuple(e for path, text in by_file.items() if f"/{rank}/error.json" in path
                      if (e := triage.parse_error_file(text, rank=rank, source=path)))
        parts.append(triage.Part(triage.Signals(log=log, error_files=files), index=rank,
                                 ranks=range(rank, rank + 1)))
    verdict = triage.root_cause(parts)
    assert verdict is not None
    assert (verdict.root_cause.index, verdict.root_cause.rank) == (run.scenario.rank,) * 2
    assert verdict.diagnosis.category.value == run.scenario.category


@pytest.mark.scenarios("two_nodes_shape")
def test_across_two_nodes_the_healthy_nodes_root_cause_block_does_not_mislead(runs) -> None:
    run = runs.get("two_nodes_shape")
    expected = run.scenario
    culprit_node = expected.rank // expected.nproc
    healthy = run.nodes[1 - culprit_node]
    # torchrun on the healthy node names one of its own ranks as the first observed failure...
    assert b"Root Cause (first observed failure)" in healthy.output
    own = judged(run, 1 - culprit_node)
    # ...which only lost its peer: on its own, that node's culprit is undetermined.
    assert own.culprit_undetermined and own.category.value == "nccl_error", own
    parts = [triage.Part(node_signals(n), index=n.node_rank, node=f"node{n.node_rank}",
                         ranks=range(n.node_rank * 2, n.node_rank * 2 + 2)) for n in run.nodes]
    for order in (parts, parts[::-1]):
        verdict = triage.root_cause(order)
        assert verdict is not None
        assert (verdict.root_cause.index, verdict.root_cause.rank) == (culprit_node, expected.rank)
        assert verdict.diagnosis.category.value == expected.category
        assert {v.index for v in verdict.victims} == {0, 1}
        assert verdict.root_cause.first_error_at is not None
