"""A run whose job records 4,096 ranks' stacks as absent is still retried, on real flows and processes.

The job (local backend) writes a stacks index of 4,096 ranks, each recorded absent, and fails with
NCCL's watchdog timeout, which is retried. The stacks' table rides in the summary, the run's
history and the retry's flow-run parameters, which Prefect refuses over 512 KiB: what travels is
bounded, and the whole table is kept with the first attempt's evidence.
"""

from __future__ import annotations

import json
import sys

from flow_helpers import attempt_dir, run

from trainguard.core.attempt import STACK_ROWS, STACKS_TABLE

JOB = r"""
import json, os, sys
ws = os.environ["TRAINGUARD_WORKSPACE"]
os.makedirs(os.path.join(ws, "stacks"), exist_ok=True)
ranks = {str(r): {"absent": "the process ended before py-spy attached " + "x" * 200, "source": "py-spy"}
         for r in range(4096)}
with open(os.path.join(ws, "stacks", "index.json"), "w") as f:
    json.dump({"started_at": 1.0, "ranks": ranks}, f)
sys.stderr.write("[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=8, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for "
                 "600011 milliseconds before timing out.\n")
sys.exit(1)
"""


def test_4096_absent_ranks_do_not_stop_the_retry_and_the_whole_table_is_kept(blocks) -> None:
    spec = {"name": "wide", "command": [sys.executable, "-c", JOB],
            "retry": {"max_attempts": 2, "delay_seconds": 0, "same_signature_limit": 0}}

    state, history = run(spec, blocks, "wide-1")

    assert [h["attempt"] for h in history] == [1, 2], state.message
    assert history[0]["category"] == "nccl_error" and history[0]["decision"]["retry"] is True
    assert len(history[0]["stacks"]["rows"]) == STACK_ROWS and history[0]["stacks"]["left_out"] == 4096 - STACK_ROWS
    first = attempt_dir(blocks["evidence"], "wide-1", 1)
    assert len((first / "verdict.json").read_bytes()) < 64 * 1024
    whole = json.loads((first / STACKS_TABLE).read_text())
    assert len(whole["rows"]) == 4096 and whole["states"] == {"no stack": 4096}
