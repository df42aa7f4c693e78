"""Supervising many Jobs at once: API requests per job-minute and how late a pod's end is noticed.

On one kubesim cluster, in the same run, N concurrent attempts are supervised by trainguard's
watch-based `Supervisor` (namespace `tg`), then N identical Jobs by prefect-kubernetes' own run
loop, `KubernetesJob.atrigger()` + `KubernetesJobRun.await_for_completion()` (namespace `pk`, its
default 5 s poll). The two sides run one after the other, each in a fresh process: run together
on 2 cores, the poll loop (it builds a new API client, TLS context included, for every call)
starved the cluster and the watches of CPU. Every Job is the one trainguard writes, its command replaced by a shell that
sleeps a while, writes the moment it ends (`date +%s.%N`) to a marker file, and exits 0 or 1.

Figures, all from the same run:
- API requests per supervised job-minute, from kubesim's request log: every request of each side in
  its namespace while its Jobs are supervised (reads, lists, watches, logs), the creates left out on
  both sides; goal: trainguard at most 1/10;
- the delay from the container's end (its marker) to the supervisor returning; goal: at most 1 s
  against the poll.

Usage: .venv/bin/python benchmarks/supervision_load.py [--jobs 50] [--seconds 180]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import faulthandler
import logging
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # one INFO line per pod log read otherwise
logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # 50 watches outgrow the pool of 10

import kubesim  # noqa: E402
import kubesim.fixture  # noqa: E402
from prefect_kubernetes.credentials import KubernetesClusterConfig, KubernetesCredentials  # noqa: E402
from prefect_kubernetes.jobs import KubernetesJob  # noqa: E402

from trainguard.core.backends.base import Launch  # noqa: E402
from trainguard.core.backends.kubernetes import manifests, zipapp  # noqa: E402
from trainguard.core.backends.kubernetes.api import KubeApi  # noqa: E402
from trainguard.core.backends.kubernetes.supervise import Limits, Supervisor  # noqa: E402

IMAGE = "ghcr.io/acme/train:1"


@dataclass
class Half:
    """One side of the comparison: when each Job's supervision started and when it noticed the end."""

    namespace: str
    started: dict[str, float] = field(default_factory=dict)
    noticed: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  # trainguard: why each supervisor stopped


def job_body(namespace: str, run_id: str, marks: Path, seconds: float, code: int) -> dict[str, Any]:
    """The Job trainguard writes for this attempt, its command replaced by a timed shell."""
    settings = manifests.JobSettings(image=IMAGE, namespace=namespace, shm_size=None)
    body = manifests.job_manifest(settings, Launch(run_id=run_id, attempt=1, command=("true",)),
                                  zipapp.config_map_name())
    name = body["metadata"]["name"]
    container = body["spec"]["template"]["spec"]["containers"][0]
    mark = marks / f"{namespace}-{name}"
    container["command"] = ["sh", "-c", f"sleep {seconds:.1f}; date +%s.%N > {mark}; exit {code}"]
    return body


def plan(jobs: int, seconds: float) -> list[tuple[str, float, int]]:
    """(run id, run time, exit code) per attempt: run times spread over [0.4, 1] x seconds."""
    return [(f"bench-{i:03d}", seconds * (0.4 + 0.6 * i / max(jobs - 1, 1)), i % 2) for i in range(jobs)]


def run_trainguard(api: KubeApi, half: Half, attempts: list[tuple[str, float, int]], marks: Path) -> None:
    def one(run_id: str, seconds: float, code: int) -> None:
        body = job_body(half.namespace, run_id, marks, seconds, code)
        name = body["metadata"]["name"]
        half.started[name] = time.time()
        created = api.create_job(half.namespace, body)  # as KubernetesBackend.run does
        # The deadline bounds a supervisor that never sees the end; it is counted, not hidden.
        limits = Limits(deadline_seconds=seconds + 30, deadline_margin_seconds=0)
        try:
            half.why[name] = Supervisor(api, half.namespace, run_id, 1, limits, created=created).run().why
        except Exception as exc:  # a benchmark reports what broke instead of stopping
            half.errors.append(f"{name}: {type(exc).__name__}: {exc}")
        half.noticed[name] = time.time()

    threads = [threading.Thread(target=one, args=a, daemon=True) for a in attempts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run_prefect(kubeconfig: Path, half: Half, attempts: list[tuple[str, float, int]], marks: Path) -> None:
    credentials = KubernetesCredentials(cluster_config=KubernetesClusterConfig.from_file(str(kubeconfig)))

    async def one(run_id: str, seconds: float, code: int) -> None:
        body = job_body(half.namespace, run_id, marks, seconds, code)
        name = body["metadata"]["name"]
        block = KubernetesJob(v1_job=body, credentials=credentials, namespace=half.namespace,
                              delete_after_completion=False)
        half.started[name] = time.time()
        run = await block.atrigger()
        try:
            await run.await_for_completion()
        except RuntimeError:
            pass  # its way of saying the Job failed: noticed all the same
        except Exception as exc:
            half.errors.append(f"{name}: {type(exc).__name__}: {exc}")
        half.noticed[name] = time.time()

    async def every() -> None:
        await asyncio.gather(*(one(*a) for a in attempts))

    asyncio.run(every())


def supervision_requests(sim: kubesim.fixture.Sim, half: Half) -> list[dict[str, Any]]:
    """The requests each side makes to follow its Jobs: reads, lists, watches, logs; never the creates."""
    first, last = min(half.started.values()), max(half.noticed.values())
    return [r for r in sim.requests(namespace=half.namespace)
            if first - 1 <= r["time"] <= last + 1 and r.get("verb") != "create"]


def breakdown(requests: list[dict[str, Any]]) -> str:
    kinds = collections.Counter(f"{r.get('verb')} {r.get('resource')}{'/' + r['subresource'] if r.get('subresource') else ''}"
                                for r in requests)
    return ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())


def figures(sim: kubesim.fixture.Sim, half: Half, marks: Path) -> dict[str, Any]:
    requests = supervision_requests(sim, half)
    job_minutes = sum(half.noticed[n] - half.started[n] for n in half.noticed) / 60
    missed = [n for n, why in half.why.items() if why == "deadline"]  # never saw the end: no delay to count
    ends = {n: marks / f"{half.namespace}-{n}" for n in half.noticed if n not in missed}
    delays = sorted(half.noticed[n] - float(mark.read_text()) for n, mark in ends.items() if mark.exists())
    return {"requests": len(requests), "job_minutes": job_minutes, "per_job_minute": len(requests) / job_minutes,
            "delay_median": statistics.median(delays), "delay_p95": delays[int(0.95 * (len(delays) - 1))],
            "delay_max": delays[-1], "ended": len(delays), "missed": len(missed), "breakdown": breakdown(requests)}


def side(name: str, kubeconfig: str, attempts: list[tuple[str, float, int]], marks: str,
         results: Any) -> None:
    """One half, in a process of its own (a fresh interpreter, no threads left over from the other)."""
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    half = Half(name)
    if name == "tg":
        api = KubeApi.from_kubeconfig(kubeconfig)
        api.api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = len(attempts) * 3
        run_trainguard(api, half, attempts, Path(marks))
    else:
        run_prefect(Path(kubeconfig), half, attempts, Path(marks))
    results.put((half.namespace, half.started, half.noticed, half.errors, half.why))


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so kubesim and its containers stop
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50, help="concurrent attempts per side")
    parser.add_argument("--seconds", type=float, default=180.0, help="longest attempt's run time")
    args = parser.parse_args()
    attempts = plan(args.jobs, args.seconds)
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="trainguard-bench-") as root:
        marks = Path(root) / "marks"
        marks.mkdir()
        nodes = [kubesim.Node(f"node-{i}", cpu="256", memory="1Ti") for i in (1, 2)]
        with kubesim.run(root=Path(root) / "sim", nodes=nodes, images={IMAGE: kubesim.Host()}, time_scale=0.05) as sim:
            api = KubeApi.from_kubeconfig(str(sim.kubeconfig))
            for namespace in ("tg", "pk"):
                api.core.create_namespace({"metadata": {"name": namespace}})
                api.create_config_map(namespace, zipapp.config_map(namespace))
            halves = {}
            for name in ("tg", "pk"):  # one after the other: the poll loop's CPU would slow the watches
                results = spawn.Queue()
                worker = spawn.Process(target=side, args=(name, str(sim.kubeconfig), attempts, str(marks), results))
                worker.start()
                namespace, started, noticed, errors, why = results.get()
                worker.join()
                halves[namespace] = Half(namespace, started, noticed, errors, why)
            ours, theirs = halves["tg"], halves["pk"]
            report(args, figures(sim, ours, marks), figures(sim, theirs, marks), ours, theirs)


def report(args: argparse.Namespace, ours: dict[str, Any], theirs: dict[str, Any], a: Half, b: Half) -> None:
    print(f"{args.jobs} concurrent attempts per side, run times {0.4 * args.seconds:.0f}-{args.seconds:.0f} s, "
          "one kubesim, one side after the other")
    for label, f in (("trainguard (watch)", ours), ("prefect-kubernetes (5 s poll)", theirs)):
        print(f"{label:32} {f['requests']:6.0f} requests / {f['job_minutes']:6.1f} job-min = "
              f"{f['per_job_minute']:6.2f} per job-minute; end noticed after median {f['delay_median']:.2f} s, "
              f"p95 {f['delay_p95']:.2f} s, max {f['delay_max']:.2f} s ({f['ended']:.0f} ends)")
        print(f"{'':32} {f['breakdown']}")
        if f["missed"]:
            print(f"{'':32} {f['missed']:.0f} supervisors never saw their Job end and stopped at the deadline")
    print(f"requests ratio trainguard / prefect-kubernetes: {ours['per_job_minute'] / theirs['per_job_minute']:.3f} "
          "(goal <= 0.1)")
    print(f"noticing delay ratio (median): {ours['delay_median'] / theirs['delay_median']:.3f} "
          f"(goal: trainguard <= 1 s; it was {ours['delay_max']:.2f} s at worst)")
    for half in (a, b):
        for error in half.errors[:5]:
            print(f"  {half.namespace} error: {error}")


if __name__ == "__main__":
    main()
