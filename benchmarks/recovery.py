"""Recovery, timed: from a fault to the first training step of the next attempt, phase by phase.

Real DDP on gloo (`benchmarks/recovery_train.py`, 2 ranks a node) meets a fault at a chosen step;
the benchmark takes the time of the fault itself and reads every later moment from what the parts
leave behind, never from its own guesses:

- the attempts' flow and task runs in the Prefect server (the attempt's `run_training` task ends when
  the backend has seen the command end; `collect_evidence`/`release_attempt` follow; the attempt's
  flow run ends once its verdict is judged, kept and reported; the next attempt's flow run starts
  after the backoff, its `run_training` task once the workspace is ready);
- on Kubernetes (kubesim), the Job's create request in kubesim's request log and a watch on the
  namespace's pods (each pod's first sight, its binding to a node, its container running);
- the training script's own timeline (`timeline.jsonl`): the torchrun agent's and rank 0's process
  start times from /proc, `init_process_group` returned, the checkpoint loaded, each step done.

Consecutive moments give the phases, so they add up to the total by construction; the moments are
checked to come in order. Steps lost = the last step completed before the fault minus the step the
next attempt resumed from. The script takes its checkpoints through `trainguard_train` (periodic
every `--checkpoint-every` steps, on notice, and just in time from a survivor), as
`examples/ddp/train.py` does. Two baselines run in the same invocation: "periodic checkpoints only"
(the same trainguard run, the script saving every `--checkpoint-every` steps itself and nothing
else) and torchelastic, the same periodic-only script under `torchrun --max-restarts 3` on one node,
restarting the workers in place from the newest checkpoint; it has no stall window, so a hung rank
is reported as not recovered within the limit.

Fault kinds: `sigkill` (rank 1, or the second node's first rank, gets SIGKILL), `evict` (kubesim:
the Eviction API on the second node's pod, with the pod's grace), `node-lost` (kubesim: the
second node crashes without notice: its processes die, its heartbeats stop), `hang` (rank 1 stops
answering; the stall window catches it).

    .venv/bin/python benchmarks/recovery.py [--backends local,kubesim] [--kinds sigkill,hang,...]
        [--repeat 3] [--backoff 1] [--baselines periodic,torchelastic] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for where in (ROOT, ROOT / "tests"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
if __name__ == "__main__":  # run as a script; a test importing it keeps its own environment
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

TRAIN = ROOT / "benchmarks" / "recovery_train.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
KINDS = ("sigkill", "evict", "node-lost", "hang")
BACKENDS = ("local", "kubesim", "slurm")
ONLY_ON = {"evict": ("kubesim",), "node-lost": ("kubesim", "slurm")}  # the other kinds run on every backend
# The phases, in order; a run's moments name where each one ends.
PHASES = ("detection", "evidence", "judgement", "backoff", "re-provision", "rendezvous", "checkpoint load",
          "first step")
OWN = ("detection", "evidence", "judgement", "backoff")  # + re-provision up to the pods' creation
PERIODIC = "trainguard, periodic checkpoints only"  # the baseline row's system
BASELINES = ("periodic", "torchelastic")


@dataclass
class Measurement:
    """One fault and the recovery from it."""

    system: str  # "trainguard", PERIODIC or "torchelastic"
    backend: str
    kind: str
    moments: list[tuple[str, float]] = field(default_factory=list)  # (what happened, unix time), in order
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds, adding up to total
    own_share: float | None = None  # fault -> the next attempt's pods (or process) created
    steps_lost: int | None = None
    failed_at_step: int | None = None
    resumed_at_step: int | None = None
    category: str | None = None
    problem: str | None = None  # why there is no figure (not recovered within the limit, ...)
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)  # "a1 collect_evidence" -> seconds from the fault

    @property
    def total(self) -> float | None:
        return self.moments[-1][1] - self.moments[0][1] if self.moments and not self.problem else None


# ---------------------------------------------------------------------------------------------------
# the training script's control folder


class Control:
    """The folder the training script reports into and the benchmark injects through."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def timeline(self) -> list[dict[str, Any]]:
        path = self.folder / "timeline.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def last_step(self) -> int:
        steps = [e["step"] for e in self.timeline() if e["event"] == "step"]
        return max(steps) if steps else 0

    def pid(self, rank: int) -> int:
        return int((self.folder / f"rank{rank}.pid").read_text())

    def wait_step(self, step: int, timeout: float, what: str) -> None:
        wait(lambda: self.last_step() >= step, timeout, f"{what}: step {step}")

    def hang(self, rank: int, timeout: float) -> float:
        """Make `rank` stop answering; the moment it did (its own mark's time)."""
        (self.folder / f"hang-rank{rank}").write_text("")
        hung = self.folder / f"hung-rank{rank}"
        wait(hung.exists, timeout, f"rank {rank} to hang")
        (self.folder / f"hang-rank{rank}").unlink()  # the next attempt's rank must not hang again
        return hung.stat().st_mtime


def wait(probe: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll `probe` until truthy; say what is awaited every 30 s; fail naming it after `timeout`."""
    start = time.monotonic()
    said = start
    while True:
        found = probe()
        if found:
            return found
        now = time.monotonic()
        if now - start > timeout:
            raise TimeoutError(f"gave up after {timeout:g} s waiting for {what}")
        if now - said > 30:
            print(f"  ... still waiting for {what} ({now - start:.0f} s)", flush=True)
            said = now
        time.sleep(interval)


def train_args(steps: int, checkpoint_every: int, step_seconds: float, periodic_only: bool = False) -> list[str]:
    return [str(TRAIN), "--steps", str(steps), "--checkpoint-every", str(checkpoint_every),
            "--step-seconds", str(step_seconds), *(["--periodic-only"] if periodic_only else [])]


# ---------------------------------------------------------------------------------------------------
# reading the Prefect server


def prefect_times(flow_run_id: str) -> dict[str, Any]:
    """The flow run's start and end, and each task run's (first of each name) start and end."""
    from uuid import UUID

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])))
    out: dict[str, Any] = {"created": _ts(run.created), "start": _ts(run.start_time), "end": _ts(run.end_time),
                           "tasks": {}}
    for task in sorted(tasks, key=lambda t: _ts(t.start_time) or 0.0):
        name = task.name.rsplit("-", 1)[0]
        out["tasks"].setdefault(name, {"start": _ts(task.start_time), "end": _ts(task.end_time)})
    return out


def _ts(moment: Any) -> float | None:
    return moment.timestamp() if moment is not None else None


# ---------------------------------------------------------------------------------------------------
# turning moments into phases


def trainguard_moments(fault_at: float, first: dict[str, Any], second: dict[str, Any], control: Control,
                       placement: list[tuple[str, float]], ended: list[float] = ()) -> list[tuple[str, float]]:
    """The ordered moments of a trainguard recovery, from the fault to the next attempt's first step.

    `placement` holds the re-provision's platform moments (Job created, pods created, scheduled,
    started), between the next attempt's training task starting and its command starting.
    """
    timeline = [e for e in control.timeline() if str(e.get("attempt")) == "2"]
    start = _event(timeline, "start")
    seen = first["tasks"]["run_training"]["end"]
    ends = [at for at in ended if fault_at <= at <= seen]  # the platform's part of the detection
    moments = [
        ("fault", fault_at),
        *([("a pod of attempt 1 ended (as the watch saw it)" if placement else
            "attempt 1's command ended (its crash report's finished_at)", ends[0])] if ends else []),
        *([(f"all {len(ends)} pods of attempt 1 ended", ends[-1])] if len(ends) > 1 else []),
        ("the backend saw the command end (attempt 1's run_training ended)", first["tasks"]["run_training"]["end"]),
        ("evidence kept, resources released (release_attempt ended)",
         _end_of(first, "release_attempt", "collect_evidence")),
        ("verdict judged, kept and reported (attempt 1's flow run ended)", first["end"]),
        ("attempt 2's flow run created (the backoff slept)", second["created"]),
        ("attempt 2's flow run started", second["start"]),
        ("attempt 2's workspace ready (its run_training started)", second["tasks"]["run_training"]["start"]),
        *placement,
        ("torchrun agent started", start["agent"] or start["worker"]),
        ("rank 0 started", start["worker"]),
        ("init_process_group returned", _event(timeline, "rendezvous")["at"]),
        ("checkpoint loaded", _event(timeline, "loaded")["at"]),
        ("first step done", _event(timeline, "step")["at"]),
    ]
    return moments


def _end_of(times: dict[str, Any], *names: str) -> float:
    for name in names:
        if name in times["tasks"] and times["tasks"][name]["end"] is not None:
            return float(times["tasks"][name]["end"])
    raise KeyError(f"none of the tasks {names} ended in the flow run")


def _event(timeline: list[dict[str, Any]], event: str) -> dict[str, Any]:
    found = next((e for e in timeline if e["event"] == event), None)
    if found is None:
        raise LookupError(f"the training left no {event!r} mark (it left {sorted({e['event'] for e in timeline})})")
    return found


# which phase each moment closes
_CLOSES = {
    "the backend saw": "detection", "a pod of attempt 1 ended": "detection",
    "attempt 1's command ended": "detection", "all ": "detection", "evidence kept": "evidence", "verdict judged": "judgement",
    "attempt 2's flow run created": "backoff", "attempt 2's flow run started": "re-provision", "attempt 2's workspace": "re-provision", "Job created": "re-provision",
    "pods created": "re-provision", "pods scheduled": "re-provision", "pods started": "re-provision",
    "torchrun agent started": "re-provision", "workers restarted": "detection",
    "rank 0 started": "rendezvous", "init_process_group": "rendezvous", "checkpoint loaded": "checkpoint load",
    "first step done": "first step",
}
OWN_END = ("pods created", "torchrun agent started")  # the first of these ends trainguard's own share


def phases_of(moments: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds per phase: each gap between consecutive moments goes to the phase its later moment closes."""
    out = {name: 0.0 for name in PHASES}
    for (_, before), (what, at) in zip(moments, moments[1:]):
        phase = next(p for prefix, p in _CLOSES.items() if what.startswith(prefix))
        out[phase] += at - before
    return out


def check_order(moments: list[tuple[str, float]], slack: float = 0.02) -> None:
    """Raise if a moment comes before the one listed ahead of it (beyond clock-reading slack: /proc's
    start times have a resolution of 10 ms)."""
    for (what_a, a), (what_b, b) in zip(moments, moments[1:]):
        if b < a - slack:
            raise ValueError(f"moments out of order: {what_b!r} at {b:.3f} before {what_a!r} at {a:.3f}")


def own_share(moments: list[tuple[str, float]]) -> float:
    end = next(at for what, at in moments if what.startswith(OWN_END))
    return end - moments[0][1]


def finish(m: Measurement, moments: list[tuple[str, float]], failed_at: int, resumed_at: int) -> Measurement:
    check_order(moments)
    m.moments, m.phases = moments, phases_of(moments)
    m.failed_at_step, m.resumed_at_step, m.steps_lost = failed_at, resumed_at, failed_at - resumed_at
    return m


# ---------------------------------------------------------------------------------------------------
# trainguard: one run, two attempts


@dataclass
class Settings:
    steps: int = 60
    fault_step: int = 24
    checkpoint_every: int = 10
    step_seconds: float = 0.2
    backoff: float = 1.0
    stall_seconds: float = 10.0
    timeout: float = 400.0
    periodic_only: bool = False  # the baseline: the script's own periodic checkpoints, no trainguard_train


def spec_for(kind: str, backend: str, control: Control, s: Settings, run: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": run, "command": [*(["python", "-m", "torch.distributed.run"] if backend == "kubesim" else TORCHRUN),
                                 *train_args(s.steps, s.checkpoint_every, s.step_seconds, s.periodic_only)],
        "processes_per_node": 2, "env": {"RECOVERY_CONTROL": str(control.folder), "OMP_NUM_THREADS": "1"},
        "retry": {"max_attempts": 3, "delay_seconds": s.backoff}, "stall_seconds": s.stall_seconds,
    }
    if backend == "kubesim":
        spec.update(nodes=2, gpus=1)
    if backend == "slurm":
        spec.update(nodes=2)
    return spec


def run_trainguard(kind: str, backend: str, blocks: dict[str, Any], workdir: Path, s: Settings,
                   inject: Callable[[Control], float],
                   placement: Callable[[str, float], list[tuple[str, float]]] | None = None,
                   ended: Callable[[], list[float]] | None = None) -> Measurement:
    """Run a spec through `training_run`; `inject` waits for the fault step, makes the fault and
    returns its moment."""
    from flows.run import training_run
    from trainguard.core.spec import parse_spec

    control = Control(workdir / f"control-{uuid.uuid4().hex[:6]}")
    run_id = f"recovery-{kind}-{uuid.uuid4().hex[:6]}"
    m = Measurement(PERIODIC if s.periodic_only else "trainguard", backend, kind)
    box: dict[str, Any] = {}

    def injector() -> None:
        try:
            control.wait_step(s.fault_step, s.timeout, "attempt 1 to reach the fault step")
            box["fault_at"] = inject(control)
        except BaseException as exc:  # said in the measurement, and the run is stopped by its own limits
            box["error"] = exc

    thread = threading.Thread(target=injector, daemon=True)
    thread.start()
    state = training_run(parse_spec(spec_for(kind, backend, control, s, run_id)), run_id=run_id,
                         backend_block=blocks["backend_block"], evidence_block=blocks["evidence_block"],
                         return_state=True)
    thread.join(timeout=5)
    history = state.result(raise_on_failure=False)
    if "error" in box or "fault_at" not in box or not isinstance(history, list) or len(history) < 2:
        why = box.get("error") or ("attempt 1 ended before the fault step" if "fault_at" not in box
                                   else "no second attempt")
        m.problem = f"{why} ({state.message})"
        return m
    m.category = history[0].get("category")
    if len(history) > 2 or history[1].get("state") != "Completed":
        m.problem = f"attempt 2 did not complete ({[h.get('category') for h in history]})"
        return m
    first, second = (prefect_times(str(h["flow_run_id"])) for h in history[:2])
    for label, times in (("a1", first), ("a2", second)):  # where trainguard's own time goes, task by task
        for name, span in times["tasks"].items():
            m.tasks[f"{label} {name}"] = {k: v - box["fault_at"] for k, v in span.items() if v is not None}
    platform = placement(run_id, first["end"]) if placement else []
    moments = trainguard_moments(box["fault_at"], first, second, control, platform, ended() if ended else [])
    loaded = _event([e for e in control.timeline() if str(e.get("attempt")) == "2"], "loaded")
    failed_at = max(e["step"] for e in control.timeline() if e["event"] == "step" and str(e.get("attempt")) == "1")
    finish(m, moments, failed_at, int(loaded["step"]))
    m.own_share = own_share(moments)
    return m


# ---------------------------------------------------------------------------------------------------
# torchelastic: the same script restarted in place


def run_torchelastic(kind: str, workdir: Path, s: Settings, give_up: float = 60.0) -> Measurement:
    control = Control(workdir / f"elastic-{uuid.uuid4().hex[:6]}")
    m = Measurement("torchelastic", "local", kind)
    command = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
               *train_args(s.steps, s.checkpoint_every, s.step_seconds, periodic_only=True), "--resume-newest"]
    env = {**os.environ, "RECOVERY_CONTROL": str(control.folder), "OMP_NUM_THREADS": "1"}
    with (control.folder / "torchrun.log").open("wb") as log:
        agent = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        control.wait_step(s.fault_step, s.timeout, "torchelastic to reach the fault step")
        fault_at = inject_local(kind, control)
        hit = max(e["restart"] for e in control.timeline())  # the workers' generation the fault hit
        try:
            wait(lambda: [e for e in control.timeline() if e["event"] == "step" and e["restart"] > hit],
                 give_up, "torchelastic's restarted workers' first step")
        except TimeoutError:
            m.problem = f"not recovered within {give_up:g} s (torchelastic has no stall window; gloo's timeout is 30 min)"
            return m
        later = [e for e in control.timeline() if e["restart"] > hit]
        start = _event(later, "start")
        moments = [("fault", fault_at), ("workers restarted", start["worker"]),
                   ("init_process_group returned", _event(later, "rendezvous")["at"]),
                   ("checkpoint loaded", _event(later, "loaded")["at"]),
                   ("first step done", _event(later, "step")["at"])]
        failed_at = max(e["step"] for e in control.timeline() if e["event"] == "step" and e["restart"] == hit)
        finish(m, moments, failed_at, int(_event(later, "loaded")["step"]))
        m.own_share = moments[1][1] - fault_at
        return m
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.pid, signal.SIGTERM)
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def inject_local(kind: str, control: Control, rank: int = 1) -> float:
    if kind == "sigkill":
        pid = control.pid(rank)
        at = time.time()
        os.kill(pid, signal.SIGKILL)
        return at
    if kind == "hang":
        return control.hang(rank, 30)
    raise ValueError(f"fault kind {kind!r} needs the kubesim or slurm backend")


# ---------------------------------------------------------------------------------------------------
# the local backend


@contextlib.contextmanager
def local_blocks(workdir: Path) -> Iterator[dict[str, Any]]:
    from blocks import EvidenceFolder, LocalProcessBackend

    suffix = uuid.uuid4().hex[:6]
    LocalProcessBackend(work_root=str(workdir / "work")).save(f"recovery-local-{suffix}", overwrite=True)
    EvidenceFolder(root=str(workdir / "evidence")).save(f"recovery-evidence-{suffix}", overwrite=True)
    yield {"backend_block": f"recovery-local-{suffix}", "evidence_block": f"recovery-evidence-{suffix}"}


def measure_local(kind: str, workdir: Path, s: Settings) -> Measurement:
    """One trainguard recovery on the local backend (1 node x 2 ranks); needs PREFECT_API_URL's server."""
    def command_ended() -> list[float]:  # the entrypoint's crash report: the command and its descendants ended
        from datetime import datetime

        found = sorted((workdir / "evidence").glob("runs/*/attempt-1/crash-report.json"))
        if not found:
            return []
        return [datetime.fromisoformat(json.loads(found[0].read_text())["finished_at"]).timestamp()]

    with local_blocks(workdir) as blocks:
        return run_trainguard(kind, "local", blocks, workdir, s, lambda c: inject_local(kind, c),
                              ended=command_ended)


# ---------------------------------------------------------------------------------------------------
# kubesim


class PodWatch:
    """First sight of each pod of a namespace, of its binding to a node and of its container running,
    as a watch delivers them."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.seen: dict[str, dict[str, float]] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self._stop = threading.Event()
        self._api, self._namespace = api, namespace
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            stream = watch.Watch()
            with contextlib.suppress(Exception):  # a dropped watch is started again
                for event in stream.stream(self._api.core.list_namespaced_pod, self._namespace, timeout_seconds=5,
                                           _request_timeout=10):
                    self._note(event["object"].to_dict() if hasattr(event["object"], "to_dict") else event["object"])
                    if self._stop.is_set():
                        stream.stop()

    def _note(self, pod: dict[str, Any]) -> None:
        now = time.time()
        meta = pod.get("metadata") or {}
        name = meta.get("name")
        marks = self.seen.setdefault(name, {"created": now})
        self.labels[name] = meta.get("labels") or {}
        if (pod.get("spec") or {}).get("node_name") or (pod.get("spec") or {}).get("nodeName"):
            marks.setdefault("scheduled", now)
        for status in (pod.get("status") or {}).get("container_statuses") or (pod.get("status") or {}).get(
                "containerStatuses") or []:
            if (status.get("state") or {}).get("running"):
                marks.setdefault("started", now)
            if (status.get("state") or {}).get("terminated"):
                marks.setdefault("ended", now)
        if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
            marks.setdefault("ended", now)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def pods_ended(watcher: PodWatch, attempt: str) -> list[float]:
    """When the watch saw each training pod of `attempt` end (its container terminated, or the pod
    Failed/Succeeded), in order."""
    from trainguard.core.backends.kubernetes import manifests

    return sorted(marks["ended"] for name, marks in watcher.seen.items() if "ended" in marks
                  and watcher.labels.get(name, {}).get(manifests.LABEL_ATTEMPT) == attempt
                  and watcher.labels.get(name, {}).get(manifests.LABEL_COMPONENT) == "training")


def kube_placement(sim: Any, watcher: PodWatch, namespace: str) -> Callable[[str, float], list[tuple[str, float]]]:
    """The next attempt's platform moments: its Job's create request, then the last of its training pods
    to be seen, bound to a node and running (attempt 2's pods, by their labels)."""
    def read(run_id: str, after: float) -> list[tuple[str, float]]:
        from trainguard.core.backends.kubernetes import manifests

        posts = [r["time"] for r in sim.requests() if r.get("method") == "POST" and r.get("resource") == "jobs"
                 and r.get("namespace") == namespace and r["time"] >= after]
        pods = [marks for name, marks in watcher.seen.items()
                if watcher.labels.get(name, {}).get(manifests.LABEL_ATTEMPT) == "2"
                and watcher.labels.get(name, {}).get(manifests.LABEL_COMPONENT) == "training"]
        out: list[tuple[str, float]] = []
        if posts:
            out.append(("Job created (its create request reached the API server)", min(posts)))
        for key, what in (("created", "pods created"), ("scheduled", "pods scheduled"), ("started", "pods started")):
            stamps = [p[key] for p in pods if key in p]
            if stamps:
                out.append((f"{what} (the last of {len(stamps)}, as the watch saw it)", max(stamps)))
        return out
    return read


def measure_kube(kind: str, workdir: Path, s: Settings, sim: Any) -> Measurement:
    from blocks import EvidenceFolder, KubernetesJobBackend
    from trainguard.core.backends.kubernetes.api import KubeApi

    suffix = uuid.uuid4().hex[:6]
    namespace = f"recovery-{suffix}"
    api = KubeApi.from_kubeconfig(str(sim.kubeconfig))
    api.core.create_namespace({"metadata": {"name": namespace}})
    KubernetesJobBackend(kubeconfig_path=str(sim.kubeconfig), namespace=namespace, image="python:3.11",
                         local_root=str(workdir / "local"), master_port=_free_port(),
                         failed_job_ttl_seconds=600).save(f"recovery-kube-{suffix}", overwrite=True)
    EvidenceFolder(root=str(workdir / "evidence")).save(f"recovery-evidence-{suffix}", overwrite=True)
    blocks = {"backend_block": f"trainguard-kubernetes-job-backend/recovery-kube-{suffix}",
              "evidence_block": f"recovery-evidence-{suffix}"}
    watcher = PodWatch(api, namespace)
    try:
        return run_trainguard(kind, "kubesim", blocks, workdir, s, lambda c: inject_kube(kind, c, sim, api, namespace),
                              kube_placement(sim, watcher, namespace), lambda: pods_ended(watcher, "1"))
    finally:
        watcher.stop()


def _second_pod(api: Any, namespace: str) -> dict[str, Any]:
    for pod in api.core.list_namespaced_pod(namespace).to_dict()["items"]:
        labels = pod["metadata"].get("labels") or {}
        index = labels.get("batch.kubernetes.io/job-completion-index") or (pod["metadata"].get(
            "annotations") or {}).get("batch.kubernetes.io/job-completion-index")
        if index == "1" and pod["status"].get("phase") == "Running":
            return pod
    raise LookupError("no running pod of index 1")


def inject_kube(kind: str, control: Control, sim: Any, api: Any, namespace: str) -> float:
    if kind in ("sigkill", "hang"):
        return inject_local(kind, control, rank=2)  # the second node's first rank
    pod = _second_pod(api, namespace)
    if kind == "evict":
        at = time.time()
        api.core.create_namespaced_pod_eviction(pod["metadata"]["name"], namespace, {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod["metadata"]["name"], "namespace": namespace}})
        return at
    if kind == "node-lost":
        at = time.time()
        sim.node(pod["spec"]["node_name"]).crash()
        return at
    raise ValueError(f"unknown fault kind {kind!r}")


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def kubesim_cluster(root: Path) -> Iterator[Any]:
    import kubesim
    import kubesim.fixture

    nodes = [kubesim.Node("gpu-node-1", gpus=2, cpu="8", memory="16Gi"),
             kubesim.Node("gpu-node-2", gpus=2, cpu="8", memory="16Gi"),
             kubesim.Node("gpu-node-3", gpus=2, cpu="8", memory="16Gi")]  # a spare for a lost node
    images = {"python:*": kubesim.HostPython(sys.executable)}
    with kubesim.run(root=root, nodes=nodes, images=images, time_scale=1.0) as sim:
        yield sim


# ---------------------------------------------------------------------------------------------------
# Slurm: the two-node cluster the tests start (tests/services/slurm_cluster.py)


@contextlib.contextmanager
def slurm_cluster(root: Path) -> Iterator[Any]:
    from services.slurm_cluster import SlurmCluster

    cluster = SlurmCluster(root)
    try:
        cluster.start()
        for node in (cluster.node, cluster.second_node):
            wait(lambda: _slurm_state(cluster, node) == "idle", 120, f"Slurm node {node} to be idle", 0.2)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _slurm_state(cluster: Any, node: str) -> str:
    done = cluster.run("scontrol", "show", "node", node, check=False)
    state = next((w.removeprefix("State=") for w in done.stdout.split() if w.startswith("State=")), "")
    return state.lower().split("+")[0]


def measure_slurm(kind: str, workdir: Path, s: Settings, cluster: Any) -> Measurement:
    """One trainguard recovery of a 2-node job (one torchrun agent of 2 ranks a node) on real Slurm."""
    from blocks import EvidenceFolder, SlurmBackend
    from services.slurm_cluster import MULTI

    suffix = uuid.uuid4().hex[:6]
    SlurmBackend(shared_folder=str(workdir / "shared"), slurm_conf=str(cluster.conf), partition=MULTI).save(
        f"recovery-slurm-{suffix}", overwrite=True)
    EvidenceFolder(root=str(workdir / "evidence")).save(f"recovery-evidence-{suffix}", overwrite=True)
    blocks = {"backend_block": f"trainguard-slurm-backend/recovery-slurm-{suffix}",
              "evidence_block": f"recovery-evidence-{suffix}"}

    def inject(control: Control) -> float:
        if kind != "node-lost":
            return inject_local(kind, control, rank=2)  # the second node's first rank
        # the second node dies without notice: its slurmd and every process of its job step at once
        victims = _ancestors_below(control.pid(2), "slurmstepd")
        at = time.time()
        cluster.processes["slurmd-2"].kill()
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cluster.processes["slurmd-2"].wait()
        # it reboots at once (the best case: with two nodes, the next attempt needs this one back)
        cluster._spawn("slurmd-2", ["slurmd", "-D", "-f", str(cluster.conf), "-N", cluster.second_node])
        return at

    try:
        return run_trainguard(kind, "slurm", blocks, workdir, s, inject)
    finally:
        if cluster.processes["slurmd-2"].poll() is not None:  # the node comes back for the next measurement
            cluster._spawn("slurmd-2", ["slurmd", "-D", "-f", str(cluster.conf), "-N", cluster.second_node])


def _ancestors_below(pid: int, name: str) -> list[int]:
    """`pid`'s process tree from its ancestor called `name` down: that ancestor and all it started."""
    top = pid
    while top > 1:
        parent = int(Path(f"/proc/{top}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if Path(f"/proc/{parent}/comm").read_text().strip() == name:
            top = parent
            break
        top = parent
    out, todo = [], [top]
    while todo:
        current = todo.pop()
        out.append(current)
        with contextlib.suppress(OSError):
            todo += [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
    return out


# ---------------------------------------------------------------------------------------------------
# the report


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _f(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(measurements: list[Measurement]) -> str:
    """One line per system, backend and fault kind: the phases' medians, the total, trainguard's own
    share and the steps lost; a line of its own for each run that did not recover."""
    header = ["system", "backend", "fault", "n", *PHASES, "total", "own share", "steps lost"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    groups: dict[tuple[str, str, str], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.system, m.backend, m.kind), []).append(m)
    for (system, backend, kind), group in groups.items():
        done = [m for m in group if m.problem is None]
        cells = [system, backend, kind, f"{len(done)}/{len(group)}"]
        cells += [_f(median([m.phases[p] for m in done])) if done else "—" for p in PHASES]
        cells += [_f(median([m.total or 0.0 for m in done])), _f(median([m.own_share or 0.0 for m in done])),
                  _f(median([float(m.steps_lost or 0) for m in done]), 0)]
        lines.append("| " + " | ".join(cells) + " |")
    for m in measurements:
        if m.problem:
            lines.append(f"\n{m.system} on {m.backend}, {m.kind}: {m.problem}")
    return "\n".join(lines)


def ratios(measurements: list[Measurement]) -> list[str]:
    out = []
    for kind in KINDS:
        ours = [m.total for m in measurements if m.system == "trainguard" and m.kind == kind and m.total]
        base = [m.total for m in measurements if m.system == "torchelastic" and m.kind == kind and m.total]
        if ours and base:
            a, b = statistics.median(ours), statistics.median(base)
            out.append(f"{kind}: trainguard {a:.1f} s / torchelastic {b:.1f} s = {a / b:.2f}x")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="local,kubesim,slurm", help=f"comma-separated: {', '.join(BACKENDS)}")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated: {', '.join(KINDS)}")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backoff", type=float, default=1.0, help="retry delay_seconds")
    parser.add_argument("--stall-seconds", type=float, default=10.0)
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help=f"comma-separated: {', '.join(BASELINES)}, or 'none'")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    kinds = [k for k in args.kinds.split(",") if k]
    baselines = [b for b in args.baselines.split(",") if b and b != "none"]
    for name, given, allowed in (("--backends", backends, BACKENDS), ("--kinds", kinds, KINDS),
                                 ("--baselines", baselines, BASELINES)):
        if unknown := sorted(set(given) - set(allowed)):
            parser.error(f"{name}: unknown {', '.join(unknown)}; choose from {', '.join(allowed)}")
    settings = Settings(backoff=args.backoff, stall_seconds=args.stall_seconds)
    periodic = Settings(backoff=args.backoff, stall_seconds=args.stall_seconds, periodic_only=True)
    systems = [("trainguard", settings), *([(PERIODIC, periodic)] if "periodic" in baselines else [])]
    from prefect.testing.utilities import prefect_test_harness

    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="recovery-") as tmp, prefect_test_harness(server_startup_timeout=120):
        workdir = Path(tmp)
        for n in range(args.repeat):
            for backend in backends:
                for kind in kinds:
                    if backend not in ONLY_ON.get(kind, BACKENDS):
                        continue
                    for system, chosen in systems:
                        print(f"[{n + 1}/{args.repeat}] {system} on {backend}: {kind}", flush=True)
                        folder = workdir / f"{backend}-{kind}-{n}{'-periodic' if chosen.periodic_only else ''}"
                        results.append(_measured(system, backend, kind, lambda: _trainguard(
                            backend, kind, folder, chosen)))
                        print("   ", _line(results[-1]), flush=True)
            if "torchelastic" in baselines:
                for kind in kinds:
                    if "local" not in ONLY_ON.get(kind, BACKENDS):
                        continue
                    print(f"[{n + 1}/{args.repeat}] torchelastic, local: {kind}", flush=True)
                    results.append(_measured("torchelastic", "local", kind, lambda: run_torchelastic(
                        kind, workdir / f"elastic-{kind}-{n}", settings)))
                    print("   ", _line(results[-1]), flush=True)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print(table(results))
    print()
    for line in ratios(results):
        print(line)
    if args.json:
        args.json.write_text(json.dumps([{**asdict(m), "total": m.total} for m in results], indent=1))


def _trainguard(backend: str, kind: str, workdir: Path, settings: Settings) -> Measurement:
    if backend == "local":
        return measure_local(kind, workdir, settings)
    if backend == "slurm":
        with slurm_cluster(Path(tempfile.mkdtemp(prefix="recovery-slurm-"))) as cluster:
            return measure_slurm(kind, workdir, settings, cluster)
    with kubesim_cluster(workdir.with_name(workdir.name + "-kubesim")) as sim:
        return measure_kube(kind, workdir, settings, sim)


def _measured(system: str, backend: str, kind: str, measure: Callable[[], Measurement]) -> Measurement:
    """One measurement; a run that broke is a row saying why, and the others still run."""
    try:
        return measure()
    except Exception as exc:
        return Measurement(system, backend, kind, problem=f"{type(exc).__name__}: {str(exc)[:300]}")


def _line(m: Measurement) -> str:
    if m.problem:
        return f"no figure: {m.problem}"
    parts = ", ".join(f"{p} {v:.2f}" for p, v in m.phases.items() if v)
    for what, at in m.moments:
        print(f"      +{at - m.moments[0][1]:7.2f} s  {what}")
    for name, span in sorted(m.tasks.items(), key=lambda item: item[1].get("start", 0.0)):
        print(f"      task {name}: +{span.get('start', float('nan')):.2f} .. +{span.get('end', float('nan')):.2f} s")
    return f"total {m.total:.2f} s (own share {_f(m.own_share)} s; {parts}); steps lost {m.steps_lost}"


if __name__ == "__main__":
    main()
