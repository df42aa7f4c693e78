"""The stacks' table a summary carries is bounded; the whole one is the evidence's.

A summary travels: in verdict.json (64 KiB reserved), in the run's history and in the next attempt's
flow-run parameters (Prefect refuses more than 512 KiB). Thousands of ranks recorded absent, or
frames thousands of characters long, must not make any of them too large.
"""

from __future__ import annotations

import json

from trainguard.core import triage
from trainguard.core.attempt import STACK_ROWS, STACKS_TABLE, AttemptSummary, Judgement, stacks_table
from trainguard.core.reports import attempt as report
from trainguard.core.triage import hangs
from trainguard.core.triage.signals import Signals

PREFECT_PARAMETERS_BYTES = 524_288


def _verdict(ranks: int) -> hangs.HangVerdict:
    waiting = hangs.ThreadStack("MainThread", (hangs.Frame("all_reduce" + "x" * 5000, "torch/distributed/c10d.py"),))
    odd = hangs.ThreadStack("MainThread", (hangs.Frame("sleep" + "y" * 5000, "train.py", 40),))
    stacks = [hangs.RankStacks(0, (odd,), node="n" * 300), hangs.RankStacks(1, (waiting,)),
              hangs.RankStacks(2, (waiting,))]
    stacks += [hangs.RankStacks(r, node=f"gpu-{r // 8}", absent="the process ended " + "z" * 2000)
               for r in range(3, ranks)]
    return hangs.odd_ones_out(stacks)


def _summary(attempt: int, verdict: hangs.HangVerdict) -> AttemptSummary:
    diagnosis = triage.classify(Signals(exit_code=1, log="Watchdog caught collective operation timeout\n"))
    return AttemptSummary(run_id="r-1", attempt=attempt, max_attempts=16, state="Failed").with_judgement(
        Judgement(diagnosis, hang=verdict))


def test_4096_ranks_recorded_absent_keep_a_summary_small_and_sixteen_attempts_under_prefects_limit() -> None:
    verdict = _verdict(4096)

    summaries = [_summary(n, verdict).to_dict() for n in range(1, 17)]

    table = summaries[0]["stacks"]
    assert len(table["rows"]) == STACK_ROWS and table["ranks"] == 4096 and table["left_out"] == 4096 - STACK_ROWS
    assert table["rows"][0]["rank"] == 0 and table["culprits"] == [0], "the culprit kept"
    assert table["states"] == {"elsewhere": 1, "waits in a collective": 2, "no stack": 4093}
    assert len(json.dumps(summaries[0])) < 32 * 1024
    assert len(json.dumps({"history": summaries})) < PREFECT_PARAMETERS_BYTES


def test_the_whole_table_has_every_row_and_the_report_says_where_it_is() -> None:
    verdict = _verdict(300)

    whole = stacks_table(verdict)
    shown = report.render_attempt(_summary(1, verdict))

    assert len(whole["rows"]) == 300 and whole["left_out"] == 0
    assert f"{300 - STACK_ROWS} more ranks in the evidence's {STACKS_TABLE}" in shown


def test_a_culprit_past_the_rows_kept_is_kept_and_the_rows_stay_in_rank_order() -> None:
    waiting = hangs.ThreadStack("MainThread", (hangs.Frame("all_reduce", "torch/distributed/c10d.py"),))
    odd = hangs.ThreadStack("MainThread", (hangs.Frame("sleep", "train.py", 40),))
    ranks = [hangs.RankStacks(r, (odd if r == 100 else waiting,)) for r in range(200)]

    table = stacks_table(hangs.odd_ones_out(ranks), STACK_ROWS)

    shown = [row["rank"] for row in table["rows"]]
    assert 100 in shown and shown == sorted(shown) and len(shown) == STACK_ROWS
