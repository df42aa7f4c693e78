"""The ranks' stacks a job leaves are read once, within bounds on their bytes, their count and their depth.

The files lie in the job's folder: it can name one 4 MiB file for 4,096 ranks, nest its index
100,000 deep, or fill its folder with stack files. Reading them must cost what one honest attempt's
stacks cost, whatever the job wrote. The memory bound is checked in a process of its own, under an
address-space limit, so a reader that amplifies fails there and not in the test's process.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

from stackfiles import py_spy_dump, write_index

from trainguard.core.backends import rankstacks
from trainguard.core.triage import hangs

_CAPPED = textwrap.dedent("""
    import resource, sys, time, tracemalloc
    from pathlib import Path
    limit = int(sys.argv[2]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from trainguard.core.backends import rankstacks
    tracemalloc.start()
    started = time.perf_counter()
    stacks = rankstacks.read_stacks(Path(sys.argv[1]))
    print(len(stacks), sum(1 for s in stacks if s.threads), tracemalloc.get_traced_memory()[1],
          time.perf_counter() - started)
""")


def _read_capped(folder: Path, limit_mib: int) -> tuple[int, int, int, float]:
    done = subprocess.run([sys.executable, "-c", _CAPPED, str(folder), str(limit_mib)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    ranks, had, peak, seconds = done.stdout.split()
    return int(ranks), int(had), int(peak), float(seconds)


def test_one_4_mib_file_named_for_4096_ranks_is_read_once_within_a_memory_cap(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "rank-0.txt").write_text(py_spy_dump(4 * 1024 * 1024), "utf-8")
    write_index(tmp_path, dict.fromkeys(range(4096), "rank-0.txt"))

    ranks, had, peak, _ = _read_capped(tmp_path, 1024)

    assert (ranks, had) == (4096, 1)
    assert peak < 200 * 1024 * 1024, f"{peak / 2**20:.0f} MiB at the peak"


def test_a_rank_naming_another_ranks_file_is_recorded_absent_and_says_whose(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "rank-0.txt").write_text(py_spy_dump(4096), "utf-8")
    write_index(tmp_path, {0: "rank-0.txt", 1: "rank-0.txt", 2: None})

    stacks = rankstacks.read_stacks(tmp_path)

    assert [(s.rank, bool(s.threads), s.absent) for s in stacks] == [
        (0, True, None), (1, False, "its stack file 'rank-0.txt' is rank 0's"), (2, False, "the process ended")]


def test_the_files_of_an_attempt_are_read_up_to_its_budget_every_node_together(tmp_path: Path) -> None:
    nodes = [tmp_path / f"node-{n}" for n in range(3)]
    for node in nodes:
        (node / "stacks").mkdir(parents=True)
        for rank in range(8):
            (node / "stacks" / f"rank-{rank}.txt").write_text(py_spy_dump(64 * 1024), "utf-8")
        write_index(node, {rank: f"rank-{rank}.txt" for rank in range(8)})
    budget = rankstacks.StackBudget(bytes_left=10 * 64 * 1024, ranks_left=20)

    read = [s for node in nodes for s in rankstacks.read_stacks(node, budget=budget)]

    assert [s.rank for s in read] == [*range(8), *range(8), *range(4)], "20 ranks in all"
    assert [bool(s.threads) for s in read] == [True] * 10 + [False] * 10
    assert {s.absent for s in read[10:]} == {"not read: the attempt's stacks are over 64 MiB"}


def test_only_the_main_thread_is_kept_and_both_ends_of_a_deep_one(tmp_path: Path) -> None:
    frames = "\n".join(f"    level_{i} (model.py:{i})" for i in range(5000))
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "rank-0.txt").write_text(
        f'Thread 1 (active): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:1)\n{frames}\n'
        f'    <module> (train.py:9)\nThread 2 (idle): "loader"\n    get (queue.py:1)\n', "utf-8")
    write_index(tmp_path, {0: "rank-0.txt"})

    (stack,) = rankstacks.read_stacks(tmp_path)

    (main,) = stack.threads
    assert main.name == "MainThread" and len(main.frames) == 2 * rankstacks.KEPT_FRAMES
    assert main.frames[0].function == "all_reduce" and main.frames[-1].function == "<module>"


def test_an_index_nested_100000_deep_reads_as_no_stacks(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "index.json").write_text('{"ranks": ' + "[" * 100_000, "utf-8")

    assert rankstacks.read_stacks(tmp_path) == ()


def test_rank_keys_that_are_not_ascii_digits_and_odd_entries_are_passed_over(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "index.json").write_text(json.dumps({"ranks": {
        "\u00b2": {"file": "x"}, "9" * 40: {"file": "y"}, "3": {"file": "../../etc/passwd", "pid": True},
        "4": ["not", "an", "entry"]}}), "utf-8")

    assert [(s.rank, s.pid, s.absent) for s in rankstacks.read_stacks(tmp_path)] == [(3, None, "no stack file")]
