"""Hung and silent real PyTorch jobs through the attempt flow on the local backend: gloo under torchrun.

A hang is caught while the ranks are alive: the stall window ends the attempt, the entrypoint
takes every rank's stack first (py-spy, or the faulthandler every rank runs when py-spy cannot),
the evidence keeps them, and triage names the rank that is somewhere else than the collective the
others wait in. A job that writes its progress only to its rank logs is not a hang. Nothing here
types a stack or a message: the stacks are taken of the live ranks. No GPU is needed: the ranks
meet over gloo.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from blocks import LocalProcessBackend
from flow_helpers import run
from processes import alive
from trainguard.core.reports import attempt as attempt_report
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
DDP = str(ROOT / "tests" / "pytorch" / "scripts" / "train_ddp.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SWEEP, GRACE = 15.0, 2.0
STALL = 25  # longer than torch's start on a loaded machine: a slow start is no hang
SLEEP_LINE = next(n for n, line in enumerate(Path(DDP).read_text().splitlines(), 1) if "time.sleep(3600)  # a rank stuck" in line)


@pytest.fixture
def hang_blocks(blocks: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """The test's blocks, the backend with a shorter sweep bound than the default 30 s."""
    name = f"hangs-{uuid.uuid4().hex[:8]}"
    LocalProcessBackend(work_root=str(tmp_path / "work"), grace_seconds=GRACE, stack_sweep_seconds=SWEEP).save(name)
    return {**blocks, "backend_block": f"trainguard-local-process-backend/{name}"}


def hang_spec(name: str, fault: str, *extra: str, tmp_path: Path, **fields: Any) -> dict[str, Any]:
    """Three ranks; rank 1 meets `fault` at step 2, the others wait for it in DDP's all-reduce (gloo's
    own timeout is ten minutes: only trainguard's stall window ends the attempt)."""
    command = [*TORCHRUN, "--nproc-per-node", "3", DDP, "--fault", fault, "--fault-rank", "1", "--fault-step", "2",
               "--steps", "6", "--timeout-seconds", "600", "--workdir", str(tmp_path), *extra]
    return {"name": name, "command": command, "stall_seconds": STALL,
            "retry": {"max_attempts": 3, "delay_seconds": 0}, **fields}


def stacks_of(blocks: dict[str, Any], run_id: str, attempt: int) -> dict[str, Any]:
    folder = blocks["evidence"] / "runs" / run_id / f"attempt-{attempt}" / "stacks"
    index: dict[str, Any] = json.loads((folder / "index.json").read_text())
    assert sorted(index["ranks"]) == ["0", "1", "2"], index
    assert all((folder / entry["file"]).read_text().strip() for entry in index["ranks"].values()), index
    return index


def test_a_rank_sleeping_in_the_loop_is_named_at_its_frame_and_the_same_hang_again_stops_the_run(
        hang_blocks, tmp_path) -> None:
    state, attempts = run(hang_spec("hang-sleep", "hang", tmp_path=tmp_path), hang_blocks, "hang-sleep-1", as_summaries=True)
    assert state.is_failed() and len(attempts) == 2  # retried once; the same frame again stops the run
    first, second = attempts
    assert (first.category, first.retryable, first.decision.retry) == ("hang", True, True)
    assert first.root_cause and first.root_cause["rank"] == 1
    assert second.category == "hang" and not second.decision.retry
    assert first.signature == second.signature == f"rank 1 at meet (train_ddp.py:{SLEEP_LINE})"  # its time.sleep
    for attempt in (1, 2):
        index = stacks_of(hang_blocks, "hang-sleep-1", attempt)
        assert {entry["source"] for entry in index["ranks"].values()} <= {"py-spy", "py-spy --native"}
    assert first.stacks and first.stacks["culprits"] == [1]
    assert [row["state"] for row in first.stacks["rows"]] == ["waits in a collective", "elsewhere",
                                                              "waits in a collective"]
    report = attempt_report.render_attempt(first)
    assert "| rank | node | state | top frames | where it differs |" in report and "meet (train_ddp.py" in report


def test_a_rank_stuck_on_its_data_loader_worker_is_named_with_the_loaders_frame(hang_blocks, tmp_path) -> None:
    spec = hang_spec("hang-loader", "loader_hang", tmp_path=tmp_path, retry={"max_total_attempts": 1, "delay_seconds": 0})
    state, attempts = run(spec, hang_blocks, "hang-loader-1", as_summaries=True)
    assert state.is_failed() and len(attempts) == 1
    only = attempts[0]
    assert only.category == "hang" and only.root_cause and only.root_cause["rank"] == 1
    frame = only.stacks["frame"] if only.stacks else ""
    assert "dataloader" in frame.lower() or "__next__" in frame, only.stacks
    stacks_of(hang_blocks, "hang-loader-1", 1)


def test_without_a_usable_py_spy_ranks_that_ignore_sigterm_give_faulthandler_stacks_and_still_end_in_time(
        hang_blocks, tmp_path) -> None:
    """py-spy cannot run (TRAINGUARD_PY_SPY names none): every rank's own faulthandler answers. Every rank
    ignores SIGTERM, so only the runner's SIGKILL after the sweep and the grace ends them: observed from the
    moment the stacks are on record to the end of the attempt, and no rank is left behind."""
    spec = hang_spec("hang-deaf", "hang", "--ignore-sigterm", tmp_path=tmp_path,
                     env={"TRAINGUARD_PY_SPY": str(tmp_path / "no-py-spy")},
                     retry={"max_total_attempts": 1, "delay_seconds": 0})
    result: dict[str, Any] = {}
    flow = threading.Thread(target=lambda: result.update(zip(("state", "attempts"), run(spec, hang_blocks,
                                                                                           "hang-deaf-1", as_summaries=True))))
    flow.start()
    index = hang_blocks["work"] / "runs" / "hang-deaf-1" / "attempt-1" / "stacks" / "index.json"
    wait_for(index.is_file, timeout=300, what="the ranks' stacks, taken as the stall window runs out", interval=0.2)
    taken = time.monotonic()
    ranks = [entry["pid"] for entry in json.loads(index.read_text())["ranks"].values()]
    wait_for(lambda: not any(alive(pid) for pid in ranks), timeout=300, what="every rank to end", interval=0.2)
    ended = time.monotonic() - taken
    flow.join(timeout=300)
    # the rest of the window (a fifth of it), then the stop's sweep and grace; slack for a loaded machine
    assert ended <= 0.2 * STALL + SWEEP + GRACE + 10, ended
    attempts = result["attempts"]
    assert attempts[0].category == "hang" and attempts[0].root_cause and attempts[0].root_cause["rank"] == 1
    stored = stacks_of(hang_blocks, "hang-deaf-1", 1)
    assert {entry["source"] for entry in stored["ranks"].values()} == {"faulthandler"}, stored


def test_a_healthy_job_that_writes_only_to_its_rank_logs_outlives_a_shorter_stall_window(hang_blocks, tmp_path) -> None:
    """`--redirects 3` and no tee: the console is silent for the whole run, longer than the window; the
    rank logs and the checkpoints move, and the entrypoint's heartbeat says so without being shown."""
    command = [*TORCHRUN, "--nproc-per-node", "2", "--redirects", "3", str(ROOT / "examples" / "ddp" / "train.py"),
               "--steps", "160", "--step-seconds", "0.25", "--checkpoint-every", "40"]
    spec = {"name": "quiet-ddp", "command": command, "stall_seconds": STALL, "env": {"PET_TEE": "0"},
            "retry": {"max_total_attempts": 1, "delay_seconds": 0}}
    state, attempts = run(spec, hang_blocks, "quiet-ddp-1", as_summaries=True)
    assert state.is_completed() and len(attempts) == 1, attempts[0].category if attempts else None
    assert attempts[0].duration_seconds > STALL + 10  # the window came and went while the console was quiet
    work = hang_blocks["work"] / "runs" / "quiet-ddp-1"
    assert sorted(p.name for p in (work / "checkpoints").iterdir())[-1] == "step-000160.pt"
    log = (work / "attempt-1" / "logs" / "train-quiet-ddp-1-attempt-1.log").read_text()
    assert "step 159" not in log and "progress:" not in log  # the steps went to the rank logs only
