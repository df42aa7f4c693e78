"""A rank that left the collective is not waiting in it: stacks taken after a collective's timeout.

Recorded by py-spy in a real two-rank gloo run (`tests/pytorch/scripts/train_ddp.py --fault hang
--fault-rank 1 --timeout-seconds 4`): rank 1 sleeps in the loop; rank 0 met gloo's timeout, and
when its stack was taken it was destroying its process group during interpreter shutdown, frames
named after gloo and c10d. Read as a wait, rank 0 made rank 1 the odd one out of a hang; it had left
the wait, so the stacks show no hang between ranks and the log's timeout judges the attempt.
"""

from __future__ import annotations

from pathlib import Path

from trainguard.core.triage import hangs

RECORDED = Path(__file__).parent / "recorded" / "teardown"


def _ranks() -> list[hangs.RankStacks]:
    return [hangs.RankStacks(rank, hangs.parse_py_spy((RECORDED / f"rank-{rank}.txt").read_text()), source="py-spy")
            for rank in (0, 1)]


def test_a_rank_destroying_its_process_group_does_not_wait_in_a_collective() -> None:
    verdict = hangs.odd_ones_out(_ranks())
    assert verdict.kind == "undetermined" and verdict.culprits == (), verdict
    assert "no rank waits in a collective" in verdict.reason
    assert [row.state for row in verdict.rows] == ["elsewhere", "elsewhere"]


def test_the_same_rank_inside_the_all_reduce_still_waits() -> None:
    waiting = hangs.parse_py_spy(
        "Thread 2513 (idle): \"MainThread\"\n"
        "    gloo::transport::tcp::UnboundBuffer::waitRecv (libtorch_cpu.so)\n"
        "    c10d::ProcessGroupGloo::AsyncWork::wait (libtorch_cpu.so)\n"
        "    _engine_run_backward (torch/autograd/graph.py:979)\n"
        "    main (train_ddp.py:163)\n"
        "    <module> (train_ddp.py:175)\n")
    ranks = [hangs.RankStacks(0, waiting, source="py-spy"), _ranks()[1]]
    verdict = hangs.odd_ones_out(ranks)
    assert (verdict.kind, verdict.culprits) == ("hang", (1,)), verdict
