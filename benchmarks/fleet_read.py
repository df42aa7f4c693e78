"""`trainguard fleet --since 30d`'s read and analysis over 100,000 verdicts, vs a bare `json.loads` loop.

The verdict index of 100,000 attempts over 30 days (500 nodes, a few percent failing) is written
into a folder store and into S3 (moto in server mode on loopback, started here), and read once by
each reader so every closed day is compacted into one JSON-lines object, as the first `fleet` of a
day does. Then, interleaved, best of 3: trainguard's read + analysis (`IndexReader` + `Tally.view`,
what the command does before printing) vs the baseline, which lists the same day prefixes, gets the
same objects through the same store and runs `json.loads` over every line. Best wall-clock and
best CPU time of each side, and the load average as it ends (other work shares the cores). Peak
memory of the trainguard side is tracemalloc's, measured in a pass of its own. Prints the figures
and the ratios.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainguard.core.evidence import index  # noqa: E402
from trainguard.core.fleet.analysis import Tally  # noqa: E402
from trainguard.core.stores.base import EvidenceStore  # noqa: E402
from trainguard.core.stores.folder import LocalEvidenceStore  # noqa: E402

CATEGORIES = ("gpu_fault", "nccl_error", "node_failure", "code_error", "cuda_oom")


def records(count: int, now: datetime) -> dict[str, list[bytes]]:
    """day -> the JSON lines of that day's records, as `index.entry` writes them."""
    chance, days = random.Random(3), {}
    for n in range(count):
        when = now - timedelta(days=29, hours=12) + timedelta(seconds=chance.randrange(29 * 86400))
        failed = chance.random() < 0.08
        category = chance.choice(CATEGORIES) if failed else None
        node = f"gpu-{chance.randrange(500):03d}"
        record = {"v": 1, "run": f"run-{n // 3:06d}", "attempt": n % 3 + 1, "ended_at": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "state": "Failed" if failed else "Completed", "category": category,
                  "rule": f"{category}-rule" if failed else None, "fingerprint": f"fp-{chance.randrange(400)}" if failed else "",
                  "signature": f"RuntimeError: {category} at step {chance.randrange(10**6)}" if failed else "",
                  "node": node, "nodes": [node], "gpu_seconds": 28800.0, "retried": failed, "avoid": []}
        days.setdefault(when.date().isoformat(), []).append(json.dumps(record, separators=(",", ":")).encode())
    return days


def fill(store: EvidenceStore, days: dict[str, list[bytes]], now: datetime) -> None:
    """The index as readers find it after the first `fleet` of the day: a part per closed day."""
    for day, lines in days.items():
        store.put_bytes(f"{index.PREFIX}{day}/compacted-bench.jsonl", b"\n".join(lines) + b"\n")


def trainguard_read(store: EvidenceStore, now: datetime) -> int:
    reader = index.IndexReader(store, now=now)
    view = Tally().add_all(reader.records(now - timedelta(days=30), now)).view()
    return view.attempts


def bare_read(store: EvidenceStore, now: datetime) -> int:
    count = 0
    for day in index.days(now - timedelta(days=30), now):
        for key in store.list_keys(f"{index.PREFIX}{day}/"):
            for line in store.get_bytes(key).splitlines():
                json.loads(line)
                count += 1
    return count


def timed(call: Callable[[], int], rounds: list[tuple[float, float]]) -> None:
    """One round's wall-clock and CPU seconds (the process's: with moto, its server thread's too)."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    rounds.append((time.perf_counter() - wall, time.process_time() - cpu))


def measure(name: str, store: EvidenceStore, now: datetime, repeat: int) -> None:
    ours: list[tuple[float, float]] = []
    bare: list[tuple[float, float]] = []
    for _ in range(repeat):  # interleaved, so load from other work weighs on both alike
        timed(lambda: bare_read(store, now), bare)
        timed(lambda: trainguard_read(store, now), ours)
    tracemalloc.start()
    attempts = trainguard_read(store, now)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    (wall, cpu), (bare_wall, bare_cpu) = (tuple(map(min, zip(*rounds))) for rounds in (ours, bare))
    print(f"{name}: {attempts:,} verdicts; bare json.loads loop {bare_wall:.2f} s, trainguard fleet read+analysis "
          f"{wall:.2f} s: {wall / bare_wall:.2f}x (goal <= 2x; CPU {bare_cpu:.2f} s vs {cpu:.2f} s: "
          f"{cpu / bare_cpu:.2f}x); peak traced memory {peak:.1f} MiB (goal <= 100 MiB); "
          f"load average {os.getloadavg()[0]:.1f}")


def s3_store(root: Path) -> tuple[EvidenceStore, Callable[[], None]]:
    from moto.server import ThreadedMotoServer

    from trainguard.core.stores.s3.bucket import S3Bucket, S3Settings
    from trainguard.core.stores.s3.spool import Spool
    from trainguard.core.stores.s3.store import S3Store, UploadPolicy

    os.environ.update({"AWS_ACCESS_KEY_ID": "AKIABENCH", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    import boto3

    boto3.client("s3", endpoint_url=f"http://{host}:{port}").create_bucket(Bucket="bench")
    settings = S3Settings(bucket="bench", region="us-east-1", endpoint_url=f"http://{host}:{port}")
    policy = UploadPolicy()
    return S3Store(S3Bucket(settings), "tg", Spool(root / "spool", policy.part_bytes), policy), server.stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verdicts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    now = datetime.now(UTC)
    days = records(args.verdicts, now)
    with tempfile.TemporaryDirectory() as folder:
        store = LocalEvidenceStore(Path(folder) / "evidence")
        fill(store, days, now)
        measure("folder", store, now, args.repeat)
        s3, stop = s3_store(Path(folder))
        try:
            fill(s3, days, now)
            measure("s3 (moto)", s3, now, args.repeat)
        finally:
            stop()


if __name__ == "__main__":
    main()
