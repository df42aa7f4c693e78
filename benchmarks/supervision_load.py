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

With `--pods N` every attempt is N pods (an Indexed Job in hold mode behind its headless Service,
each pod under trainguard's entrypoint; each attempt in a namespace of its own): one pod fails at
the attempt's run time, the others on their own 3 s later, as ranks that lost a peer do (until then
each prints a step line every 10 s, as training does; a log stream silent for 5 minutes is
reopened, which a silent pod would pay for on every stream). trainguard
runs each attempt as the flow does (`KubernetesBackend.run`: two watches and a log stream per pod,
then every pod's evidence, then the culprit across pods); the poll loop supervises the same
Indexed Job (without the entrypoint). Figures: the same requests per supervised job-minute (goal:
at most 1/10 of the poll loop's for the same pods), and the time from the first pod's failure to the
attempt judged (evidence of every pod kept, the root cause named; goal <= 10 s plus the survivors'
grace), beside the poll loop's time to merely notice the end.

Usage: .venv/bin/python benchmarks/supervision_load.py [--jobs 50] [--seconds 180]
       .venv/bin/python benchmarks/supervision_load.py --pods 8 --jobs 8 --seconds 600
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
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
if __name__ == "__main__":  # run as a script; a test importing it keeps its own environment
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # one INFO line per pod log read otherwise
logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # 50 watches outgrow the pool of 10

import kubesim  # noqa: E402
import kubesim.fixture  # noqa: E402
from prefect_kubernetes.credentials import KubernetesClusterConfig, KubernetesCredentials  # noqa: E402
from prefect_kubernetes.jobs import KubernetesJob  # noqa: E402

from trainguard.core import judging  # noqa: E402
from trainguard.core.backends.base import Launch  # noqa: E402
from trainguard.core.backends.kubernetes import manifests, zipapp  # noqa: E402
from trainguard.core.backends.kubernetes.api import KubeApi  # noqa: E402
from trainguard.core.backends.kubernetes.errors import Conflict  # noqa: E402
from trainguard.core.backends.kubernetes.backend import KubernetesBackend, KubeSettings  # noqa: E402
from trainguard.core.backends.kubernetes.supervise import Limits, Supervisor  # noqa: E402
from trainguard.core.stores.folder import LocalEvidenceStore  # noqa: E402

IMAGE = "ghcr.io/acme/train:1"


@dataclass
class Half:
    """One side of the comparison: when each Job's supervision started and when it noticed the end."""

    namespace: str
    started: dict[str, float] = field(default_factory=dict)
    noticed: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  # trainguard: why each supervisor stopped
    judged: dict[str, float] = field(default_factory=dict)  # several pods: when the culprit was named
    culprits: dict[str, Any] = field(default_factory=dict)  # several pods: (category, index) judged


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


SURVIVORS_SECONDS = 3.0  # the other pods fail on their own this long after the first
STEP_SECONDS = 10.0  # the pods print a step line this often, as training does (a silent stream is reopened)


def pods_script(mark: Path, seconds: float, first: int) -> str:
    """One pod's command: pod `first` raises at `seconds` (PyTorch's words for a shape mismatch) and marks
    the moment; the others lose their peer 3 s later (gloo's words), as ranks on other nodes do."""
    own = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x12 and 16x4)"
    lost = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.7]:29500"
    steps, rest = divmod(seconds, STEP_SECONDS)  # a training pod logs its progress: one line per step
    train = f"i=0; while [ $i -lt {int(steps)} ]; do echo \"step $i\"; sleep {STEP_SECONDS:g}; i=$((i+1)); done; "
    return (train + f'sleep {rest:.1f}; if [ "$NODE_RANK" = {first} ]; then date +%s.%N > {mark}; '
            f"echo '{own}' >&2; exit 1; fi; sleep {SURVIVORS_SECONDS:g}; echo '{lost}' >&2; exit 1")


def pods_launch(run_id: str, pods: int, mark: Path, seconds: float, first: int) -> Launch:
    return Launch(run_id=run_id, attempt=1, command=("sh", "-c", pods_script(mark, seconds, first)), nodes=pods)


def pods_body(namespace: str, launch: Launch) -> dict[str, Any]:
    """The Indexed Job trainguard writes, for the poll loop: the shell without the entrypoint, not suspended."""
    body = manifests.job_manifest(manifests.JobSettings(image=IMAGE, namespace=namespace, shm_size=None), launch,
                                  zipapp.config_map_name())
    body["spec"]["suspend"] = False
    body["spec"]["template"]["spec"]["containers"][0]["command"] = list(launch.command)
    return body


def run_trainguard_pods(api: KubeApi, half: Half, attempts: list[tuple[str, float, int]], marks: Path,
                        pods: int, root: Path) -> None:
    """Each attempt as the flow runs it: the backend's run, then every pod's evidence, then the judging."""
    def one(index: int, run_id: str, seconds: float) -> None:
        namespace = f"{half.namespace}-{index}"
        settings = KubeSettings(manifests.JobSettings(image=IMAGE, namespace=namespace, shm_size=None),
                                local_root=str(root / "local"))
        backend = KubernetesBackend(lambda: api, settings)
        name = namespace  # each attempt in a namespace of its own: its requests are its own
        try:
            half.started[name] = time.time()
            ref = backend.provision(run_id, 1)
            outcome = backend.run(ref, pods_launch(run_id, pods, marks / namespace, seconds, index % pods))
            half.noticed[name] = time.time()
            backend.collect_evidence(ref, LocalEvidenceStore(root / "evidence"), outcome)
            judged = judging.judge(backend, ref, outcome)
            half.judged[name] = time.time()
            root_cause = judged.across.root_cause if judged.across else None
            half.culprits[name] = (judged.diagnosis.category.value if judged.diagnosis else None,
                                   root_cause.index if root_cause else None, index % pods)
            backend.release(ref)
        except Exception as exc:  # a benchmark reports what broke instead of stopping
            half.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            half.noticed.setdefault(name, time.time())

    threads = [threading.Thread(target=one, args=(i, run_id, seconds), daemon=True)
               for i, (run_id, seconds, _) in enumerate(attempts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run_prefect_pods(kubeconfig: Path, half: Half, attempts: list[tuple[str, float, int]], marks: Path,
                     pods: int) -> None:
    """The same Indexed Jobs under prefect-kubernetes' run loop."""
    credentials = KubernetesCredentials(cluster_config=KubernetesClusterConfig.from_file(str(kubeconfig)))

    api = KubeApi.from_kubeconfig(str(kubeconfig))
    for index in range(len(attempts)):  # the pods mount it, as trainguard's do: this process's own digest
        with contextlib.suppress(Conflict):
            api.create_config_map(f"{half.namespace}-{index}", zipapp.config_map(f"{half.namespace}-{index}"))

    async def one(index: int, run_id: str, seconds: float) -> None:
        namespace = name = f"{half.namespace}-{index}"
        launch = pods_launch(run_id, pods, marks / namespace, seconds, index % pods)
        block = KubernetesJob(v1_job=pods_body(namespace, launch), credentials=credentials, namespace=namespace,
                              delete_after_completion=False)
        await poll_until_done(half, name, block)

    async def every() -> None:
        await asyncio.gather(*(one(i, run_id, seconds) for i, (run_id, seconds, _) in enumerate(attempts)))

    asyncio.run(every())


async def poll_until_done(half: Half, name: str, block: KubernetesJob) -> None:
    """One Job under prefect-kubernetes' own run loop, from its trigger to the end it notices."""
    half.started[name] = time.time()
    run = await block.atrigger()
    try:
        await run.await_for_completion()
    except RuntimeError:
        pass  # its way of saying the Job failed: noticed all the same
    except Exception as exc:
        half.errors.append(f"{name}: {type(exc).__name__}: {exc}")
    half.noticed[name] = time.time()


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
        await poll_until_done(half, name, block)

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


def pods_figures(sim: kubesim.fixture.Sim, half: Half, marks: Path) -> dict[str, Any]:
    """Attempts of several pods: each namespace's requests while its attempt was supervised, and the
    time from its first pod's failure to the end noticed and (trainguard) to the culprit named."""
    requests = [r for ns in half.noticed for r in sim.requests(namespace=ns)
                if half.started[ns] <= r["time"] <= half.noticed[ns] and r.get("verb") != "create"]
    job_minutes = sum(half.noticed[n] - half.started[n] for n in half.noticed) / 60
    first = {n: float((marks / n).read_text()) for n in half.noticed if (marks / n).exists()}
    noticed = sorted(half.noticed[n] - first[n] for n in first)
    judged = sorted(half.judged[n] - first[n] for n in first if n in half.judged)
    right = sum(1 for category, index, failed in half.culprits.values() if index == failed)
    return {"requests": len(requests), "job_minutes": job_minutes, "per_job_minute": len(requests) / job_minutes,
            "noticed_median": statistics.median(noticed), "noticed_max": noticed[-1],
            "judged_median": statistics.median(judged) if judged else None, "judged_max": judged[-1] if judged else None,
            "culprits_right": right, "categories": sorted({c for c, _, _ in half.culprits.values()}, key=str),
            "ended": len(noticed), "breakdown": breakdown(requests)}


def side(name: str, kubeconfig: str, attempts: list[tuple[str, float, int]], marks: str,
         results: Any, pods: int = 1, root: str = "") -> None:
    """One half, in a process of its own (a fresh interpreter, no threads left over from the other)."""
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    half = Half(name)
    if name == "tg":
        api = KubeApi.from_kubeconfig(kubeconfig)
        api.api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = len(attempts) * (3 + 2 * pods)
        if pods > 1:
            run_trainguard_pods(api, half, attempts, Path(marks), pods, Path(root))
        else:
            run_trainguard(api, half, attempts, Path(marks))
    elif pods > 1:
        run_prefect_pods(Path(kubeconfig), half, attempts, Path(marks), pods)
    else:
        run_prefect(Path(kubeconfig), half, attempts, Path(marks))
    results.put(dataclasses.asdict(half))  # plain data: the class is __mp_main__'s in this process


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so kubesim and its containers stop
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50, help="concurrent attempts per side")
    parser.add_argument("--seconds", type=float, default=180.0, help="longest attempt's run time")
    parser.add_argument("--pods", type=int, default=1, help="pods of each attempt (an Indexed Job when above 1)")
    args = parser.parse_args()
    attempts = plan(args.jobs, args.seconds)
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="trainguard-bench-") as root:
        marks = Path(root) / "marks"
        marks.mkdir()
        nodes = [kubesim.Node(f"node-{i}", cpu="256", memory="1Ti") for i in (1, 2)]
        with kubesim.run(root=Path(root) / "sim", nodes=nodes, images={IMAGE: kubesim.Host()}, time_scale=0.05) as sim:
            api = KubeApi.from_kubeconfig(str(sim.kubeconfig))
            spaces = [f"{side}-{i}" for side in ("tg", "pk") for i in range(args.jobs)] if args.pods > 1 else ["tg", "pk"]
            for namespace in spaces:
                api.core.create_namespace({"metadata": {"name": namespace}})
                api.create_config_map(namespace, zipapp.config_map(namespace))
            halves = {}
            for name in ("tg", "pk"):  # one after the other: the poll loop's CPU would slow the watches
                results = spawn.Queue()
                worker = spawn.Process(target=side, args=(name, str(sim.kubeconfig), attempts, str(marks), results,
                                                          args.pods, root))
                worker.start()
                halves[name] = Half(**results.get())
                worker.join()
            ours, theirs = halves["tg"], halves["pk"]
            if args.pods > 1:
                pods_report(args, pods_figures(sim, ours, marks), pods_figures(sim, theirs, marks), ours, theirs)
            else:
                report(args, figures(sim, ours, marks), figures(sim, theirs, marks), ours, theirs)


def pods_report(args: argparse.Namespace, ours: dict[str, Any], theirs: dict[str, Any], a: Half, b: Half) -> None:
    print(f"{args.jobs} concurrent attempts of {args.pods} pods per side, the first pod failing after "
          f"{0.4 * args.seconds:.0f}-{args.seconds:.0f} s and the others {SURVIVORS_SECONDS:g} s later; one kubesim, "
          "one side after the other")
    for label, f in (("trainguard (watch)", ours), ("prefect-kubernetes (5 s poll)", theirs)):
        print(f"{label:32} {f['requests']:6.0f} requests / {f['job_minutes']:6.1f} job-min = "
              f"{f['per_job_minute']:6.2f} per job-minute; end noticed after median {f['noticed_median']:.2f} s, "
              f"max {f['noticed_max']:.2f} s from the first pod's failure ({f['ended']:.0f} attempts)")
        print(f"{'':32} {f['breakdown']}")
    print(f"requests ratio trainguard / prefect-kubernetes: {ours['per_job_minute'] / theirs['per_job_minute']:.3f} "
          "(goal <= 0.1)")
    if ours["judged_median"] is not None:
        print(f"first pod's failure to judged (every pod's evidence kept, the culprit named): median "
              f"{ours['judged_median']:.2f} s, max {ours['judged_max']:.2f} s (goal <= 10 s + the survivors' grace, "
              f"here they fail {SURVIVORS_SECONDS:g} s after it); culprit index right in {ours['culprits_right']} "
              f"of {len(a.culprits)}, categories {ours['categories']}")
    for half in (a, b):
        for error in half.errors[:5]:
            print(f"  {half.namespace} error: {error}")


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
