"""Uploading a 1 GiB evidence bundle to S3: trainguard's S3 store vs boto3's `upload_file`.

The bundle (a core dump, a checkpoint and a training log, 1 GiB together) goes to the same local S3
server (moto in server mode on loopback, started here) twice per round, each time from a fresh
child process so that peak RSS is that upload's alone:

- baseline: boto3's `upload_file` with default settings (the AWS CLI's transfer engine: 8 MiB
  parts, 10 threads), one call per file;
- trainguard: `S3Store.put_file` per file with the block's defaults, which sends each file's parts
  (8 MiB, 10 at a time) while it reads and hashes the file, each with its SHA-256 for S3 to check,
  and keeps a spool copy only of what S3 did not take.

Peak RSS is the child's own high-water mark (VmHWM in /proc/self/status): getrusage's ru_maxrss
would carry the parent's peak across the exec. "Above the loaded client" subtracts the RSS once
boto3 is imported and the client built, which both sides pay alike.

Prints each round, then the medians, the throughput ratio (goal >= 1.0x) and the whole process's
peak RSS ratio (goal <= 0.5x), with the ratio above the loaded client beside it. The endpoint is
plain HTTP: there botocore hashes every body for the SigV4 signature unless told not to (trainguard's
client is: each write carries its own SHA-256), which costs `upload_file` CPU it does not spend
over HTTPS. Usage: `.venv/bin/python benchmarks/evidence_upload.py [--rounds 2] [--mib 1024]`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARES = (("coredumps/core.4242", 0.75), ("checkpoint/step-000900.pt", 0.1875), ("logs/train-rank0.log", 0.0625))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_moto(port: int) -> subprocess.Popen[bytes]:
    # objects in moto's memory rather than its temporary files: the server's disk traffic is no
    # part of either client's cost (it needs about 4 GiB of RAM for a 1 GiB bundle)
    env = {**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(2 * 1024**3)}
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2).close()
            return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("moto_server did not answer within 60 s")


def make_bundle(folder: Path, total_mib: int) -> list[Path]:
    """Files of pseudo-random bytes (one random MiB repeated, a counter in each MiB)."""
    block = os.urandom(1024 * 1024)
    files = []
    for name, share in SHARES:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            for i in range(max(1, round(total_mib * share))):
                out.write(i.to_bytes(8, "little") + block[8:])
        files.append(path)
    return files


def child(kind: str, endpoint: str, bucket: str, folder: Path, spool: Path) -> None:
    """Upload the bundle one way and print seconds and peak RSS as JSON."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    if kind == "baseline":
        import boto3

        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        before_mib, started, cpu = _rss_mib(), time.perf_counter(), os.times()
        for path in files:
            client.upload_file(str(path), bucket, f"baseline/{path.relative_to(folder).as_posix()}")
    else:
        from trainguard.core.stores.s3.bucket import S3Bucket, S3Settings
        from trainguard.core.stores.s3.store import S3Store, UploadPolicy
        from trainguard.core.stores.s3.spool import Spool

        policy = UploadPolicy()
        store = S3Store(S3Bucket(S3Settings(bucket=bucket, region="us-east-1", endpoint_url=endpoint,
                                            max_connections=policy.concurrency + 2)),
                        "trainguard", Spool(spool, policy.part_bytes), policy)
        before_mib, started, cpu = _rss_mib(), time.perf_counter(), os.times()
        for path in files:
            store.put_file(f"runs/bench/attempt-1/{path.relative_to(folder).as_posix()}", path)
        if store.pending():
            raise SystemExit(f"not uploaded: {store.pending()} ({store.last_error})")
    seconds = time.perf_counter() - started
    cpu_seconds = sum(os.times()[:2]) - sum(cpu[:2])  # this process's own user + system time
    peak_mib = _status_mib("VmHWM:")  # ru_maxrss would carry the parent's peak across the exec
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_mib": peak_mib, "upload_rss_mib": peak_mib - before_mib,
                      "bytes": sum(p.stat().st_size for p in files)}))


def _rss_mib() -> float:
    """The process's RSS now (boto3 loaded, client built): the floor the upload's own memory sits on."""
    return _status_mib("VmRSS:")


def _status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no {field} in /proc/self/status")


def run_child(kind: str, endpoint: str, bucket: str, folder: Path, spool: Path) -> dict[str, float]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--child", kind, endpoint, bucket, str(folder), str(spool)],
                         check=True, capture_output=True, text=True, env=env)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_rounds(endpoint: str, rounds: int, mib: int) -> dict[str, list[dict[str, float]]]:
    """Baseline and trainguard, interleaved per round so drift in load hits both."""
    results: dict[str, list[dict[str, float]]] = {"baseline": [], "trainguard": []}
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
        folder = Path(tmp) / "bundle"
        files = make_bundle(folder, mib)
        print(f"bundle: {len(files)} files, {sum(p.stat().st_size for p in files) / 2**20:.0f} MiB; "
              f"moto_server at {endpoint}")
        for round_no in range(1, rounds + 1):
            for kind in ("baseline", "trainguard"):
                bucket = f"bench-{kind}-{round_no}"
                urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")).close()
                result = run_child(kind, endpoint, bucket, folder, Path(tmp) / f"spool-{round_no}")
                results[kind].append(result)
                print(f"round {round_no} {kind:10s} {result['seconds']:6.2f} s "
                      f"{result['bytes'] / 2**20 / result['seconds']:6.1f} MiB/s  client CPU {result['cpu_seconds']:5.1f} s  peak RSS {result['peak_rss_mib']:.1f} "
                      f"MiB ({result['upload_rss_mib']:.1f} MiB above the loaded client)")
                urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, endpoint, bucket, folder, spool = args.child
        return child(kind, endpoint, bucket, Path(folder), Path(spool))
    port = free_port()
    server = start_moto(port)
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"})
    try:
        results = run_rounds(f"http://127.0.0.1:{port}", args.rounds, args.mib)
    finally:
        server.terminate()
        server.wait(30)
    summary = {kind: [statistics.median(r[field] for r in rs) for field in ("seconds", "peak_rss_mib", "upload_rss_mib")]
               for kind, rs in results.items()}
    mib = args.mib
    (base_s, base_rss, base_up), (ours_s, ours_rss, ours_up) = summary["baseline"], summary["trainguard"]
    print(f"baseline upload_file: {base_s:.2f} s ({mib / base_s:.1f} MiB/s), peak RSS {base_rss:.1f} MiB "
          f"({base_up:.1f} above the loaded client)")
    print(f"trainguard S3 store:  {ours_s:.2f} s ({mib / ours_s:.1f} MiB/s), peak RSS {ours_rss:.1f} MiB "
          f"({ours_up:.1f} above the loaded client)")
    print(f"throughput ratio {base_s / ours_s:.2f}x (goal >= 1.0x; on plain HTTP, where upload_file's client also "
          f"hashes every body for its signature); peak RSS ratio {ours_rss / base_rss:.2f}x of the whole process "
          f"(goal <= 0.5x: {'met' if ours_rss <= 0.5 * base_rss else 'not met'}); "
          f"above the loaded client {ours_up / base_up:.2f}x")


if __name__ == "__main__":
    main()
