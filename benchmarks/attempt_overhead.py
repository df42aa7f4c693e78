"""trainguard's own time per attempt against a bare Prefect flow with 5 no-op tasks.

Both run in this process against the same temporary Prefect server, after one warm-up run each.
trainguard's time is the attempt flow's wall time minus the training command's own run time (as
the container entrypoint measured it), so what remains is provisioning, the entrypoint's snapshots,
evidence collection, triage, the retry decision and the report. Usage:

    .venv/bin/python benchmarks/attempt_overhead.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # run as a script; a test importing it keeps its own environment
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefect import flow, task  # noqa: E402
from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from blocks import EvidenceFolder, LocalProcessBackend  # noqa: E402
from flows.attempt import train_attempt  # noqa: E402
from trainguard.core.spec import parse_spec  # noqa: E402


@task
def noop(i: int) -> int:
    return i


@flow
def bare_flow() -> None:
    for i in range(5):
        noop(i)


def time_bare() -> float:
    start = time.perf_counter()
    bare_flow()
    return time.perf_counter() - start


def time_attempt(n: int, root: Path, blocks: dict[str, str]) -> float:
    run_id = f"bench-{n}"
    spec = parse_spec({"name": "bench", "command": [sys.executable, "-c", "print('step 1 loss 0.5')"]})
    start = time.perf_counter()
    state = train_attempt(spec, run_id=run_id, return_state=True, **blocks)
    wall = time.perf_counter() - start
    assert state.is_completed(), state.message
    report = json.loads((root / "evidence/runs" / run_id / "attempt-1/crash-report.json").read_text())
    return wall - float(report["duration_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=120):
        root = Path(tmp)
        LocalProcessBackend(work_root=str(root / "work")).save("bench-backend", overwrite=True)
        EvidenceFolder(root=str(root / "evidence")).save("bench-evidence", overwrite=True)
        blocks = {"backend_block": "bench-backend", "evidence_block": "bench-evidence"}
        time_bare(), time_attempt(0, root, blocks)  # warm-up: imports, first-run caches
        bare, ours = [], []
        for n in range(1, args.runs + 1):  # interleaved, so load on the machine hits both alike
            bare.append(time_bare())
            ours.append(time_attempt(n, root, blocks))
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"bare Prefect flow, 5 no-op tasks: median {b:.3f} s  (runs: {', '.join(f'{x:.2f}' for x in bare)})")
    print(f"trainguard attempt overhead:      median {o:.3f} s  (runs: {', '.join(f'{x:.2f}' for x in ours)})")
    print(f"ratio trainguard / bare: {o / b:.2f}x  (goal <= 1.5x)")


if __name__ == "__main__":
    main()
