"""Attempts per minute through 1, 2 and 4 process workers, against a bare Prefect flow; retry latency.

One PostgreSQL-backed Prefect server (a throwaway cluster, as the tests start it), the `train-attempt`
deployment of prefect.yaml on its process work pool, and N real `prefect worker start` processes
(one flow run at a time each). The fixed workload is R runs of the tiny trainer that fail with an
NCCL timeout on attempt 1 and resume to succeed on attempt 2 (zero backoff): 2R attempts. The
baseline is a bare Prefect flow with as many no-op tasks as the attempt flow has, 2R runs through the
same workers in the same run. Figures:

- attempts (or bare runs) per minute: all of them, from the first submission to the last end;
- cost per attempt: the mean run time of one flow run as the server records it, and its slope per
  added worker (flat = concurrency adds no cost of ours; the bare flow's slope is the machine's own);
- CPU per attempt: the CPU seconds the workers' process trees (flow processes, entrypoints, trainers),
  the Prefect server and PostgreSQL spent on the workload, divided by its attempts, and its slope per
  added worker. Wall time per attempt grows once more flow processes run than the machine has
  cores; CPU per attempt stays flat unless something of ours costs more as concurrency grows
  (contention, retries, queries that grow with the number of runs);
- retry latency: from a failed attempt's end to its successor being scheduled (the hook), and to
  the successor running (a worker picking it up, a new flow process starting), median and worst;
  once within the workload (the successor queues behind the other runs' attempts) and once for a
  lone run afterwards, when a worker is free (the latency trainguard itself adds).

Usage: .venv/bin/python benchmarks/throughput_runs.py [--runs 4] [--workers 1 2 4]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

if __name__ == "__main__":  # run as a script; a test importing it keeps its own environment
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from prefect import flow, get_client, task  # noqa: E402
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags  # noqa: E402
from prefect.deployments import run_deployment  # noqa: E402
from prefect.settings import PREFECT_API_URL, temporary_settings  # noqa: E402

from blocks import EvidenceFolder, LocalProcessBackend  # noqa: E402
from services.postgres import postgres_cluster  # noqa: E402
from services.prefect_server import PREFECT, prefect_server, process_workers, quiet_env  # noqa: E402
from trainguard.demo import SCRIPT  # noqa: E402

POOL = "trainguard-local"
ATTEMPT_TASKS = 8  # provision, train, collect evidence, release, classify, decide, report, record verdict


@task
def noop(i: int) -> int:
    return i


@flow(name="bare-attempt")
def bare_attempt() -> None:
    """The baseline: a flow run with as many tasks as an attempt, doing nothing."""
    for i in range(ATTEMPT_TASKS):
        noop(i)


def prefect_cli(api_url: str, *args: str) -> None:
    subprocess.run([PREFECT, "--no-prompt", *args], cwd=ROOT, check=True, capture_output=True, timeout=300,
                   env=quiet_env(api_url, TRAINGUARD_PROJECT_DIR=str(ROOT)))


def runs_tagged(tags: list[str]) -> list:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(any_=tags)))


def wait_done(tags: list[str], count: int, timeout: float = 1800) -> list:
    """The flow runs with any of `tags` once there are `count` of them and all have ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = runs_tagged(tags)
        if len(runs) >= count and all(r.state and r.state.is_final() for r in runs):
            return runs
        time.sleep(0.5)
    raise SystemExit(f"runs tagged {tags} did not finish within {timeout:g}s")


def measure(runs: list, started: float) -> dict[str, float]:
    last_end = max(r.end_time.timestamp() for r in runs)
    return {"per_minute": len(runs) * 60 / (last_end - started),
            "cost": statistics.mean(r.total_run_time.total_seconds() for r in runs)}


def trainguard_workload(n_runs: int, blocks: dict[str, str]) -> tuple[dict[str, float], list[tuple[float, float]]]:
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    lineages = [f"trainguard-run:{tag}-{i}" for i in range(n_runs)]  # next attempts carry only these
    started = time.time()
    for i in range(n_runs):
        spec = {"name": "bench", "retry": {"delay_seconds": 0},
                "command": [sys.executable, str(SCRIPT), "--steps", "30", "--step-seconds", "0",
                            "--fail-at-step", "15", "--fail-on-attempt", "1"]}
        run_deployment("train-attempt/local-pool", timeout=0, tags=[lineages[i]],
                       parameters={"spec": spec, "run_id": f"{tag}-{i}", **blocks})
    runs = wait_done(lineages, 2 * n_runs)
    assert all(r.state.is_completed() == (r.parameters.get("attempt", 1) == 2) for r in runs), "unexpected outcome"
    by_id = {str(r.id): r for r in runs}
    latency = []
    for run in (r for r in runs if r.parameters.get("attempt", 1) == 2):
        failed_at = by_id[run.parameters["parent_flow_run_id"]].end_time
        latency.append(((run.created - failed_at).total_seconds(), (run.start_time - failed_at).total_seconds()))
    return measure(runs, started), latency


def bare_workload(n_flows: int) -> dict[str, float]:
    tag = f"bare-{uuid.uuid4().hex[:8]}"
    started = time.time()
    for _ in range(n_flows):
        run_deployment("bare-attempt/bench", timeout=0, tags=[tag])
    runs = wait_done([tag], n_flows)
    assert all(r.state.is_completed() for r in runs), "a bare flow run failed"
    return measure(runs, started)


TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and of its reaped children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / TICK


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds spent so far by `roots` and every descendant, living or reaped.

    A reaped descendant's time is in its parent's children times; a living one is counted itself.
    """
    stats = {int(e.name): _stat(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit()}
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        if st is not None:
            children.setdefault(st[0], []).append(pid)
    total, todo = 0.0, list(roots)
    while todo:
        pid = todo.pop()
        st = stats.get(pid)
        if st is not None:
            total += st[1]
            todo.extend(children.get(pid, ()))
    return total


def service_roots(server_port: int, pg_folder: Path) -> list[int]:
    """The Prefect server's process and PostgreSQL's postmaster: the services every run costs."""
    needle = f"--port\0{server_port}".encode()
    server = [int(e.name) for e in Path("/proc").iterdir()
              if e.name.isdigit() and needle in _read(e / "cmdline") and b"server" in _read(e / "cmdline")]
    postmaster = int((pg_folder / "data" / "postmaster.pid").read_text().split()[0])
    outermost = [pid for pid in server if (_stat(pid) or (0, 0.0))[0] not in server]  # the tree, counted once
    return [*outermost, postmaster]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def slope(xs: list[int], ys: list[float]) -> float:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4, help="training runs per setting (2 attempts each)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server and workers on the way out
    with tempfile.TemporaryDirectory() as tmp, postgres_cluster() as pg, prefect_server(pg.url()) as server, \
            temporary_settings({PREFECT_API_URL: server.api_url}):
        root = Path(tmp)
        LocalProcessBackend(work_root=str(root / "work")).save("bench-backend", overwrite=True)
        EvidenceFolder(root=str(root / "evidence")).save("bench-evidence", overwrite=True)
        blocks = {"backend_block": "trainguard-local-process-backend/bench-backend", "evidence_block": "bench-evidence"}
        prefect_cli(server.api_url, "work-pool", "create", POOL, "--type", "process", "--overwrite")
        prefect_cli(server.api_url, "deploy", "--name", "local-pool")
        prefect_cli(server.api_url, "deploy", "benchmarks/throughput_runs.py:bare_attempt", "--name", "bench",
                    "--pool", POOL)
        rows = []
        for n in args.workers:
            with process_workers(n, POOL, server.api_url, root / f"workers-{n}", ROOT, limit=1,
                                 TRAINGUARD_PROJECT_DIR=str(ROOT)) as workers:
                roots = [*(w.pid for w in workers), *service_roots(int(server.api_url.rsplit(":", 1)[1].split("/")[0]),
                                                                  pg.folder)]
                before = tree_cpu(roots)
                ours, latency = trainguard_workload(args.runs, blocks)
                middle = tree_cpu(roots)
                bare = bare_workload(2 * args.runs)
                ours["cpu"], bare["cpu"] = (middle - before) / (2 * args.runs), (tree_cpu(roots) - middle) / (2 * args.runs)
                _, idle = trainguard_workload(1, blocks)  # one lineage alone: no queue in front of the successor
            rows.append((n, ours, bare, latency))
            print(f"{n} worker(s): trainguard {ours['per_minute']:.1f} attempts/min (mean {ours['cost']:.2f} s, "
                  f"{ours['cpu']:.2f} CPU s each), bare {bare['per_minute']:.1f} runs/min (mean {bare['cost']:.2f} s, "
                  f"{bare['cpu']:.2f} CPU s each), ratio {ours['per_minute'] / bare['per_minute']:.2f}x; "
                  f"under load {describe(latency)}; with a free worker {describe(idle)}", flush=True)
    report(rows)


def report(rows: list) -> None:
    xs = [n for n, *_ in rows]
    if len(xs) < 2:
        return
    ours = slope(xs, [o["cost"] for _, o, _, _ in rows])
    bare = slope(xs, [b["cost"] for _, _, b, _ in rows])
    base, bare_base = rows[0][1]["cost"], rows[0][2]["cost"]
    print(f"cost per attempt vs workers: slope {ours:+.3f} s per added worker ({ours / base:+.1%} of the "
          f"1-worker cost); bare flow's slope {bare:+.3f} s per added worker ({bare / bare_base:+.1%}: the machine's "
          f"own contention)")
    cpu, bare_cpu = (slope(xs, [r[key]["cpu"] for r in rows]) for key in (1, 2))
    print(f"CPU per attempt vs workers: slope {cpu:+.3f} CPU s per added worker ({cpu / rows[0][1]['cpu']:+.1%} of "
          f"the 1-worker {rows[0][1]['cpu']:.2f} CPU s); bare flow's {bare_cpu:+.3f} CPU s per added worker")
    print(f"all settings: {describe([x for *_, lat in rows for x in lat])}")


def describe(latency: list[tuple[float, float]]) -> str:
    """Median and worst of (failure -> successor scheduled, failure -> successor running)."""
    scheduled, running = [s for s, _ in latency], [r for _, r in latency]
    return (f"failure -> next attempt scheduled: median {statistics.median(scheduled):.2f} s; "
            f"-> running: median {statistics.median(running):.2f} s, worst {max(running):.2f} s")


if __name__ == "__main__":
    main()
