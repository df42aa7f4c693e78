"""trainguard's time per attempt on Slurm against a bare `sbatch --wait` of the same command.

Starts the tests' throwaway single-node Slurm (tests/services/slurm_cluster.py, with slurmdbd over MariaDB for
accounting: needs slurm-wlm, munge, slurmdbd, slurm-wlm-mysql-plugin and mariadb-server-core, as
`./dev test` installs them), then, interleaved and after one warm-up each:

- bare: `sbatch --wait --no-requeue --wrap "srun COMMAND"`, wall time from submission to return;
- trainguard: the Slurm backend's share of one attempt (provision, sbatch with the entrypoint
  under srun, supervision with squeue and the log tail, the final scontrol reads, evidence
  collection with sacct's record and its manifest, and triage's signals), wall time.

It also measures how long after a job's end trainguard has its outcome: a side thread polls
`squeue` for the job as fast as it can; the delay runs from the first terminal state it sees to
`run()` returning (block defaults: squeue backoff up to 2 s). `sbatch --wait` polls the controller
itself with growing sleeps, so on short jobs the bare baseline is the slower one. Usage:

    .venv/bin/python benchmarks/slurm_overhead.py [--runs 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from services.slurm_cluster import SlurmCluster  # noqa: E402

from trainguard.core.backends.base import Launch  # noqa: E402
from trainguard.core.backends.slurm.client import TERMINAL_STATES, SlurmClient  # noqa: E402
from trainguard.core.backends.slurm.backend import SlurmBackend  # noqa: E402
from trainguard.core.stores.folder import LocalEvidenceStore  # noqa: E402
from trainguard.demo import SCRIPT  # noqa: E402

COMMAND = (sys.executable, str(SCRIPT), "--steps", "20", "--step-seconds", "0.05")


def time_bare(cluster: SlurmCluster, folder: Path) -> float:
    wrapped = "srun " + " ".join(COMMAND)
    start = time.perf_counter()
    cluster.run("sbatch", "--wait", "--parsable", "--no-requeue", f"--output={folder}/bare-%j.out",
                f"--chdir={folder}", "--wrap", wrapped, timeout=300)
    return time.perf_counter() - start


class _Observer(threading.Thread):
    """Polls squeue for the attempt's job as fast as it can; notes when it first looks terminal."""

    def __init__(self, cluster: SlurmCluster, name: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.name = cluster, name
        self.ended_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.ended_at is None:
            done = self.cluster.run("squeue", "--noheader", "--states=all", f"--name={self.name}", "--format=%T",
                                    check=False)
            if any(state in TERMINAL_STATES for state in done.stdout.split()):
                self.ended_at = time.perf_counter()


def time_trainguard(
    backend: SlurmBackend, cluster: SlurmCluster, n: int, store: LocalEvidenceStore
) -> tuple[float, float, float]:
    run_id = f"bench-{n}"
    start = time.perf_counter()
    ref = backend.provision(run_id, 1)
    observer = _Observer(cluster, ref.name)
    observer.start()
    outcome = backend.run(ref, Launch(run_id, 1, COMMAND), on_line=lambda line: None)
    returned = time.perf_counter()
    observer.stop.set()
    observer.join()
    collected = backend.collect_evidence(ref, store, outcome)
    evidence = time.perf_counter() - returned
    backend.signals(ref, outcome)
    wall = time.perf_counter() - start
    assert outcome.succeeded, outcome.message
    assert "slurm/sacct.txt" in {item.name for item in collected.manifest.items}, collected.manifest.missing
    notice = returned - observer.ended_at if observer.ended_at is not None else float("nan")
    return wall, notice, evidence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    folder = Path(tempfile.mkdtemp(prefix="tg-slurm-bench-"))
    cluster = SlurmCluster(folder / "cluster")
    try:
        cluster.start()
        deadline = time.monotonic() + 60
        while cluster.node_state() != "idle":
            if time.monotonic() > deadline:
                raise SystemExit("the Slurm node never became idle")
            time.sleep(0.2)
        backend = SlurmBackend(folder / "shared", client=SlurmClient(env=cluster.env))
        store = LocalEvidenceStore(folder / "evidence")
        time_bare(cluster, folder), time_trainguard(backend, cluster, 0, store)  # warm-up
        bare, ours, notice, evidence = [], [], [], []
        for n in range(1, runs + 1):
            bare.append(time_bare(cluster, folder))
            wall, delay, kept = time_trainguard(backend, cluster, n, store)
            ours.append(wall)
            notice.append(delay)
            evidence.append(kept)
        b, t = statistics.median(bare), statistics.median(ours)
        print(f"bare sbatch --wait: median {b:.2f} s  ({', '.join(f'{x:.2f}' for x in bare)})")
        print(f"trainguard attempt: median {t:.2f} s  ({', '.join(f'{x:.2f}' for x in ours)})")
        print(f"ratio: {t / b:.2f}x bare sbatch --wait (trainguard's own share: {t - b:+.2f} s per attempt)")
        print(f"of which evidence collection (sacct record included): median {statistics.median(evidence):.2f} s")
        print(f"job end -> trainguard has the outcome: median {statistics.median(notice):.2f} s, "
              f"max {max(notice):.2f} s")
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
