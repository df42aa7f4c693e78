"""The odd one out of a hung job, from real stacks of real ranks taken with py-spy while they wait.

Three gloo ranks under torchrun; one of them stops at step 2 (a sleep in the training loop, or a
DataLoader worker that never answers) while the others block in DDP's all-reduce. Nothing here
is typed by hand: the stacks are py-spy's dumps of the live processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from processes import alive
from trainguard.core.backends.local.backend import free_port
from trainguard.core.triage import hangs
from trainguard_entrypoint import stacks
from waiting import wait_for

SCRIPT = Path(__file__).parent / "scripts" / "train_ddp.py"
PY_SPY = str(Path(sys.executable).parent / "py-spy")


def _ranks(agent: int) -> dict[int, int]:
    """rank -> pid of the agent's workers, from their environment."""
    found = {}
    for child in Path(f"/proc/{agent}/task/{agent}/children").read_text().split():
        try:
            env = dict(item.split("=", 1) for item in Path(f"/proc/{child}/environ").read_text().split("\0") if "=" in item)
        except OSError:
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = int(child)
    return found


def _waits(dump: str) -> bool:
    return any(frame.collective for thread in hangs.parse_py_spy(dump) if thread.main for frame in thread.frames[:12])


def _dump(pid: int, *extra: str) -> str:
    """py-spy's dump of a live process; on a loaded machine py-spy can fail to stop it in time, so
    it is asked again until the dump holds a thread."""
    return wait_for(lambda: (lambda out: out if "Thread " in out else None)(subprocess.run(
        [PY_SPY, "dump", "--pid", str(pid), *extra], capture_output=True, text=True, timeout=60).stdout),
        timeout=120, what=f"a py-spy dump of {pid}", interval=0.2)


@pytest.fixture
def hung(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[int, int]]:
    """A 3-rank job whose rank 1 meets `request.param` at step 2: yields rank -> pid once rank 1 is stuck.

    Its Python processes run the faulthandler site the entrypoint installs (stacks.faulthandler_site),
    so the fallback can be asked too; the agent's pid is under key -1.
    """
    env = {**os.environ, **stacks.faulthandler_site(tmp_path, os.environ)}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", str(free_port()),
            str(SCRIPT), "--fault", request.param, "--fault-rank", "1", "--fault-step", "2",
            "--timeout-seconds", "600", "--steps", "6", "--workdir", str(tmp_path)]
    out = tmp_path / "ranks.out"
    with out.open("wb") as sink:
        agent = subprocess.Popen(argv, stdout=sink, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    ranks: dict[int, int] = {}
    try:
        ranks = wait_for(lambda: (lambda found: found if len(found) == 3 else None)(_ranks(agent.pid)),
                         timeout=120, what="3 ranks")
        # Every rank passes through its DataLoader and DDP's all-reduce at every step: the stacks
        # show the hang for good only once every rank has finished the last step before it (rank 1's
        # loader hangs on the batch of step 1; its sleep is in step 2).
        last = "step 1 " if request.param == "hang" else "step 0 "
        wait_for(lambda: out.read_text(errors="replace").count(last) == 3, timeout=120,
                 what=f"every rank to print {last.strip()!r}", interval=0.2)
        stuck = "meet (train_ddp.py" if request.param == "hang" else "dataloader.py"
        wait_for(lambda: stuck in _dump(ranks[1]), timeout=120, what="rank 1 to be stuck", interval=0.5)
        wait_for(lambda: all(_waits(_dump(ranks[r])) for r in (0, 2)), timeout=120,
                 what="ranks 0 and 2 to wait for rank 1 in a collective", interval=0.5)
        yield {**ranks, -1: agent.pid}
    finally:
        for pid in ranks.values():  # torchrun starts each worker in a session of its own, which
            with contextlib.suppress(ProcessLookupError):  # its DataLoader workers share: stop them all
                os.killpg(pid, signal.SIGKILL)
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
        wait_for(lambda: not any(alive(pid) for pid in ranks.values()), timeout=30, what="the ranks to end")


@pytest.mark.parametrize("hung", ["hang"], indirect=True)
def test_a_rank_sleeping_in_the_training_loop_is_the_odd_one_out_with_its_frame(hung: dict[int, int]) -> None:
    hung = {r: p for r, p in hung.items() if r >= 0}
    taken = [hangs.RankStacks(rank, hangs.parse_py_spy(_dump(pid)), pid=pid, source="py-spy")
             for rank, pid in sorted(hung.items())]
    verdict = hangs.odd_ones_out(taken)
    assert (verdict.kind, verdict.culprits) == ("hang", (1,))
    assert verdict.frame.startswith("meet (train_ddp.py:")
    assert [row.state for row in verdict.rows] == ["waits in a collective", "elsewhere", "waits in a collective"]

    native = [hangs.RankStacks(rank, hangs.parse_py_spy(_dump(pid, "--native")), pid=pid, source="py-spy --native")
              for rank, pid in sorted(hung.items()) if rank >= 0]
    assert hangs.odd_ones_out(native).culprits == (1,)
    # named at its Python frame, not at a native address that differs in every process
    assert hangs.odd_ones_out(native).frame.startswith("meet (train_ddp.py:")
    assert any("c10d::" in f.function for t in native[0].threads for f in t.frames)  # the native frames were read


@pytest.mark.parametrize("hung", ["loader_hang"], indirect=True)
def test_a_rank_waiting_on_a_stuck_data_loader_worker_is_named_with_the_loaders_frame(hung: dict[int, int]) -> None:
    taken = [hangs.RankStacks(rank, hangs.parse_py_spy(_dump(pid)), pid=pid) for rank, pid in sorted(hung.items())
             if rank >= 0]
    verdict = hangs.odd_ones_out(taken)
    assert verdict.culprits == (1,) and verdict.kind == "hang", (verdict.reason, verdict.rows)
    assert "dataloader" in verdict.frame.lower() or "__next__" in verdict.frame


def test_faulthandlers_dump_of_all_threads_is_read_like_py_spys(tmp_path: Path) -> None:
    code = ("import faulthandler, threading, time\n"
            "def worker():\n    time.sleep(30)\n"
            "threading.Thread(target=worker, name='loader', daemon=True).start()\n"
            "time.sleep(0.2)\nfaulthandler.dump_traceback(all_threads=True)\n")
    text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30).stderr
    threads = hangs.parse_faulthandler(text)
    assert len(threads) == 2
    assert any(f.function == "worker" for t in threads for f in t.frames)
    assert any(t.main for t in threads)


def test_too_few_stacks_or_everyone_in_one_place_names_nobody() -> None:
    same = hangs.ThreadStack("MainThread", (hangs.Frame("all_reduce", "torch/distributed/distributed_c10d.py", 1),
                                            hangs.Frame("<module>", "train.py", 2)))
    verdict = hangs.odd_ones_out([hangs.RankStacks(0, (same,)), hangs.RankStacks(1, (same,)),
                                  hangs.RankStacks(2, absent="py-spy: Permission denied (no ptrace)")])
    assert verdict.kind == "undetermined" and verdict.culprits == ()
    assert verdict.rows[2].state == "no stack" and "Permission denied" in verdict.rows[2].differs


@pytest.mark.parametrize("hung", ["hang"], indirect=True)
def test_the_entrypoints_sweep_finds_every_rank_under_the_agent_and_keeps_each_stack(hung, tmp_path) -> None:
    index = stacks.capture(hung[-1], tmp_path, budget_seconds=60, why="stall")
    assert sorted(index["ranks"]) == ["0", "1", "2"]
    assert {entry["source"] for entry in index["ranks"].values()} <= {"py-spy", "py-spy --native"}
    read = [hangs.RankStacks(int(rank), hangs.parse_py_spy((tmp_path / "stacks" / entry["file"]).read_text()))
            for rank, entry in index["ranks"].items()]
    assert hangs.odd_ones_out(read).culprits == (1,)


@pytest.mark.parametrize("hung", ["hang"], indirect=True)
def test_without_py_spy_the_faulthandler_each_rank_runs_gives_the_stacks(hung, tmp_path) -> None:
    index = stacks.capture(hung[-1], tmp_path, budget_seconds=60, py_spy="/nonexistent/py-spy", why="stall")
    assert {entry["source"] for entry in index["ranks"].values()} == {"faulthandler"}, index["ranks"]
    read = [hangs.RankStacks(int(rank), hangs.parse_faulthandler((tmp_path / "stacks" / entry["file"]).read_text()))
            for rank, entry in index["ranks"].items()]
    verdict = hangs.odd_ones_out(read)
    assert verdict.culprits == (1,) and verdict.frame.startswith("meet (train_ddp.py:")
