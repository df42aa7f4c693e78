"""From the trigger to every rank's stack stored, for 2, 4 and 8 hung ranks, vs a bare `py-spy dump` loop.

Each size is a real hung job: the entrypoint runs `torchrun --nproc-per-node N` of
tests/pytorch/scripts/train_ddp.py over gloo, rank 1 sleeps in its training loop and the others wait
for it in DDP's all-reduce. Once every rank is in place, the two are timed in turn on the same
processes, `--runs` times each, interleaved:

- trainguard: SIGQUIT to the entrypoint (what `trainguard dump` sends) until `stacks/index.json`
  says every rank's stack is stored (found under the agent, asked in parallel, written to files);
- the baseline: `py-spy dump --pid P` for each rank's pid, one after the other, output kept in memory.

Both with Python frames only, then both with `--native` (the local default). Usage:

    .venv/bin/python benchmarks/hang_capture.py [--sizes 2 4 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainguard_entrypoint import stacks  # noqa: E402

SCRIPT = ROOT / "tests" / "pytorch" / "scripts" / "train_ddp.py"
PY_SPY = str(Path(sys.executable).parent / "py-spy")


def start(size: int, folder: Path, port: int, native: bool) -> subprocess.Popen[bytes]:
    """The entrypoint around a hung N-rank torchrun job."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAINGUARD_STACK_SWEEP_SECONDS": "60",
           "TRAINGUARD_STACK_NATIVE": "1" if native else "0"}
    argv = [sys.executable, "-m", "trainguard_entrypoint", "--workspace", str(folder), "--run-id", "bench",
            "--attempt", "1", "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(size),
            "--master-port", str(port), str(SCRIPT), "--fault", "hang", "--fault-rank", "1", "--fault-step", "2",
            "--timeout-seconds", "3600", "--steps", "6", "--workdir", str(folder)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def hung(entrypoint: int, size: int, timeout: float = 600) -> dict[int, int]:
    """rank -> pid once every rank is there and rank 1 sleeps in its loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = stacks.ranks(entrypoint)
        if len(ranks) == size and 1 in ranks:
            out = subprocess.run([PY_SPY, "dump", "--pid", str(ranks[1])], capture_output=True, text=True).stdout
            if "meet (train_ddp.py" in out:
                return ranks
        time.sleep(1)
    raise SystemExit(f"{size} ranks did not hang in place within {timeout:.0f}s")


def bare_loop(pids: list[int], native: bool) -> float:
    started = time.perf_counter()
    had = 0
    for pid in pids:
        done = subprocess.run([PY_SPY, "dump", "--pid", str(pid), *(["--native"] if native else [])],
                              capture_output=True, text=True)
        had += "Thread " in done.stdout
    took = time.perf_counter() - started
    if had != len(pids):
        raise SystemExit(f"the bare loop had {had} of {len(pids)} stacks: the figures would not compare")
    return took


def trainguard(entrypoint: int, folder: Path, size: int) -> float:
    """SIGQUIT to the entrypoint until the index lists every rank with its stack file."""
    index = folder / "stacks" / "index.json"
    index.unlink(missing_ok=True)
    started = time.perf_counter()
    os.kill(entrypoint, signal.SIGQUIT)
    while True:
        try:
            ranks = json.loads(index.read_text())["ranks"]
            if len(ranks) == size and all(entry.get("file") for entry in ranks.values()):
                return time.perf_counter() - started
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.01)


def measure(size: int, native: bool, runs: int, port: int) -> tuple[float, float]:
    """(trainguard's median, the bare loop's median) on one hung job of `size` ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        proc = start(size, folder, port, native)
        ranks: dict[int, int] = {}
        try:
            ranks = hung(proc.pid, size)
            ours, bare = [], []
            for _ in range(runs):
                bare.append(bare_loop(list(ranks.values()), native))
                ours.append(trainguard(proc.pid, folder, size))
            return statistics.median(ours), statistics.median(bare)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in ranks.values():  # torchrun puts each rank in a session of its own
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"hang capture, median of {args.runs}: trigger -> every stack stored, vs a bare py-spy dump loop")
    port = 29700
    for size in args.sizes:
        for native in (False, True):
            port += 1
            ours, bare = measure(size, native, args.runs, port)
            mode = "--native" if native else "python"
            print(f"  {size} ranks, {mode:8}: trainguard {ours:6.2f} s   bare loop {bare:6.2f} s   "
                  f"ratio {ours / bare:4.2f}x  (goal <= 1.5x{', <= 10 s' if size == 8 else ''})", flush=True)

if __name__ == "__main__":
    main()
