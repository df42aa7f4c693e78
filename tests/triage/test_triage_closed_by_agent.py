"""A culprit its agent SIGTERMed while it was tearing down is still the culprit.

Recorded from a real run under load (`recorded/torchrun_culprit_closed_by_agent.log`, paths
shortened): rank 1 of 3 raises FileNotFoundError at step 2 and prints its traceback, but its
process is slow to end (its process group's destructors). Rank 2 loses it, exits first, and
torchrun's agent names rank 2 the root cause and SIGTERMs the other two, rank 1 among them
(`exitcode: -15`). A rank the closing signal ended is a victim only if it had not already failed
on its own: rank 1's own error is the attempt's cause, rank 0 (ended while it waited in a
collective) and rank 2 (a lost peer) are its victims.
"""

from __future__ import annotations

from pathlib import Path

from trainguard.core import triage
from trainguard.core.taxonomy import Category

RECORDED = Path(__file__).parent / "recorded" / "torchrun_culprit_closed_by_agent.log"


def test_a_culprit_ended_by_its_agents_closing_signal_is_still_named() -> None:
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=RECORDED.read_text()), engine="re")

    assert diagnosis is not None
    assert (diagnosis.category, diagnosis.rule_id) == (Category.DATA_ERROR, "data.not_found")
    assert diagnosis.rank == 1 and not diagnosis.culprit_undetermined, diagnosis
    assert {(v.rank, v.rule_id) for v in diagnosis.victims} == {(0, "torchrun.closing_signal"),
                                                                (2, "gloo.peer_lost")}


def test_a_rank_the_closing_signal_ended_in_a_collective_stays_a_victim() -> None:
    log = RECORDED.read_text().replace("FileNotFoundError: [Errno 2] No such file or directory",
                                       "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer")

    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log), engine="re")

    assert diagnosis is not None and diagnosis.culprit_undetermined, diagnosis
    assert diagnosis.category is Category.NCCL_ERROR
