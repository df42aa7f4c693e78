"""A training job that forges the records trainguard reads from its folder, then fails with a code error.

`FORGER` runs as a real attempt's command, with one argument saying what it forges:

- ``amplify``: one 64 KiB py-spy stack file (`stacks/rank-0.txt`) and a `stacks/index.json` that
  names it for `AMPLIFIED_RANKS` ranks, the shape of the 4,096-name index over one 4 MiB file;
- ``nested``: torchelastic's error file and `stacks/index.json` nested 100,000 deep, and a
  `progress.json` whose time is a 400-digit integer.

Then it prints for a few seconds (a supervisor polls it running meanwhile), prints a TypeError's
traceback and exits 1. Whatever it forged, the attempt must still be judged a code error.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainguard.core.triage import hangs

AMPLIFIED_RANKS = 64

FORGER = r"""
import json, os, sys, time
mode, ws = sys.argv[1], os.environ["TRAINGUARD_WORKSPACE"]
os.makedirs(os.path.join(ws, "stacks"), exist_ok=True)
if mode == "amplify":
    lines = ['Thread 7 (active): "MainThread"', "    all_reduce (torch/distributed/distributed_c10d.py:2050)",
             "    train (train.py:40)", "    <module> (train.py:99)"]
    n = 0
    while sum(len(line) + 1 for line in lines) < 64 * 1024:
        lines += [f'Thread {100 + n} (idle): "loader_{n}"'] + [f"    wait_{i} (threading.py:{i})" for i in range(50)]
        n += 1
    with open(os.path.join(ws, "stacks", "rank-0.txt"), "w") as f:
        f.write("\n".join(lines))
    entries = {str(r): {"file": "rank-0.txt", "source": "py-spy", "pid": 7} for r in range(int(sys.argv[2]))}
    with open(os.path.join(ws, "stacks", "index.json"), "w") as f:
        json.dump({"started_at": time.time(), "ranks": entries}, f)
else:
    os.makedirs(os.path.join(ws, "torchelastic"), exist_ok=True)
    with open(os.path.join(ws, "torchelastic", "error.json"), "w") as f:
        f.write('{"message": ' + "[" * 100000)
    with open(os.path.join(ws, "stacks", "index.json"), "w") as f:
        f.write('{"started_at": 1, "ranks": ' + "[" * 100000)
    with open(os.path.join(ws, "progress.json"), "w") as f:
        f.write('{"at": ' + "9" * 400 + "}")
for step in range(8):
    print(f"step {step} loss 0.5", flush=True)
    time.sleep(0.5)
print("Traceback (most recent call last):", flush=True)
print('  File "train.py", line 3, in <module>', flush=True)
print("TypeError: unsupported operand type(s) for +: 'int' and 'str'", flush=True)
sys.exit(1)
"""


def forger(mode: str) -> tuple[str, ...]:
    """The job's command line, less the Python that runs it."""
    return ("-c", FORGER, mode, str(AMPLIFIED_RANKS))


def check_amplified(stacks: Sequence[hangs.RankStacks]) -> None:
    """The amplifying index read as it must be: its file once, for the first rank naming it."""
    assert len(stacks) == AMPLIFIED_RANKS, len(stacks)
    had = [s.rank for s in stacks if s.threads]
    assert had == [0], f"the file was parsed for ranks {had[:5]}..., not once"
    assert {s.absent for s in stacks[1:]} == {"its stack file 'rank-0.txt' is rank 0's"}
