"""One pod on a simulated node, from admission to termination.

What belongs here: admission (GPU indices, pod IP), a loop per container (image, env,
volumes, start, wait, restartPolicy with back-off 10 s doubling to 300 s, CrashLoopBackOff),
keeping only the current and previous log of each container, termination on deletion
(SIGTERM, grace, SIGKILL, then the kubelet's grace-0 delete), pressure eviction and the
kubelet's events about the pod. Messages follow pkg/kubelet (kuberuntime_container.go,
pod_workers.go) of Kubernetes 1.32.

What does not: the node-wide sync loop (kubelet.py), the status it reports (podstatus.py),
what sets native sidecars apart (sidecars.py), deriving env/argv/volumes (workload.py),
processes (runtime.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubesim import mounts, podstatus, runtime, serviceaccount, sidecars, workload
from kubesim.podstatus import ContainerState
from kubesim.store import timestamp

if TYPE_CHECKING:
    from kubesim.kubelet import Kubelet

log = logging.getLogger("kubesim.kubelet")

BACKOFF_START_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0


def involved(pod: dict[str, Any]) -> dict[str, Any]:
    """The part of a pod an Event's involvedObject is built from."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}


def pod_ref(pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    return f"{meta['name']}_{meta['namespace']}({meta['uid']})"


def finalize_deletion(kubelet: Kubelet, pod: dict[str, Any]) -> None:
    """The containers are gone: the kubelet's grace-0 delete lets the API drop the object
    (at once, or when the last finalizer goes)."""
    if not kubelet.connected or pod["metadata"].get("deletionGracePeriodSeconds") == 0:
        return
    meta = pod["metadata"]

    def final(obj: dict[str, Any]) -> None:
        obj["metadata"]["deletionGracePeriodSeconds"] = 0

    kubelet.store.mutate("pods", meta["namespace"], meta["name"], final)


def pod_dir(root: Path, pod: dict[str, Any]) -> Path:
    meta = pod["metadata"]
    return root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"


class PodWorker:
    """Drives one pod from admission to termination."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        self.kubelet = kubelet
        self.pod = pod
        self.init_containers = [ContainerState(c, init=True)
                                for c in pod["spec"].get("initContainers") or []]
        self.containers = [ContainerState(c) for c in pod["spec"].get("containers", [])]
        if self.init_containers:
            for c in self.containers:
                c.state = {"waiting": {"reason": "PodInitializing"}}
        self.gpus: list[int] = []
        self.ip = ""
        self.finished = False
        self.deleting = asyncio.Event()
        # (reason, message) once the kubelet fails the pod itself: Evicted, DeadlineExceeded.
        self.failure: tuple[str, str] | None = None
        self.stop_grace: float | None = None  # set once the containers are being stopped
        self.mains_done = False  # every regular container has ended: sidecars stop too
        self.sidecar_tasks: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._sleepers: set[asyncio.Future[None]] = set()
        self._stoppers: set[asyncio.Future[runtime.Exit]] = set()
        podstatus.recover(self, pod)

    @property
    def dir(self) -> Path:
        return pod_dir(self.kubelet.config.root, self.pod)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp") and not self.deleting.is_set():
            self.deleting.set()
            self.wake()
            if self.finished:
                finalize_deletion(self.kubelet, pod)

    def wake(self) -> None:
        for sleeper in list(self._sleepers):
            sleeper.cancel()

    async def evict(self, resource: str) -> None:
        """Pressure eviction: kill the containers now and fail the pod with reason Evicted."""
        await self.fail("Evicted", podstatus.eviction_message(self, resource), grace_seconds=0)

    async def fail(self, reason: str, message: str, *, grace_seconds: float,
                   warning: bool = True) -> None:
        """The kubelet fails the pod: stop its containers, phase Failed with this reason."""
        if self.failure is not None or self.finished:
            return
        self.failure = (reason, message)
        self.wake()
        self.kubelet.event(self.pod, reason, message, warning=warning)
        await self.stop_containers(grace_seconds)
        self.publish()

    async def _enforce_deadline(self) -> None:
        # Unscaled like the Job's: the pod's own number stays honest (kubelet active deadline).
        deadline = self.pod["spec"].get("activeDeadlineSeconds")
        if deadline is None:
            return
        started = datetime.fromisoformat(self.started_at.replace("Z", "+00:00")).timestamp()
        await asyncio.sleep(max(started + int(deadline) - time.time(), 0))
        await self.fail("DeadlineExceeded",
                        "Pod was active on the node longer than the specified deadline",
                        grace_seconds=self.pod["spec"].get("terminationGracePeriodSeconds", 30),
                        warning=False)  # active_deadline.go records a Normal event

    def abandon(self) -> None:
        """Kill the containers without reporting (node crash, pod object gone)."""
        for task in [self._task, *self.sidecar_tasks]:
            if task is not None:
                task.cancel()
        for c in self.all_containers:
            if c.instance is not None:
                c.instance.signal(9)
                self.kubelet.reap(c.instance)
                c.instance = None

    async def _run(self) -> None:
        try:
            self._admit()
            watchers = [asyncio.ensure_future(self.watch_deletion()),
                        asyncio.ensure_future(self._enforce_deadline())]
            if await self._initialize():
                await asyncio.gather(*(self.container_loop(c) for c in self.containers))
            await sidecars.finish(self)
            for watcher in watchers:
                watcher.cancel()
            await self._terminate()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("kubesim kubelet: pod worker for %s crashed", pod_ref(self.pod))

    def _admit(self) -> None:
        want = int(workload.requests_of(self.pod).get("nvidia.com/gpu", 0))
        self.gpus = self.kubelet.free_gpus()[:want]
        self.ip = self.ip or self.kubelet.allocate_ip()
        self.publish()

    # -- container lifecycle -------------------------------------------------------------------

    async def _initialize(self) -> bool:
        """Run the init containers one after the other; False when one failed for good."""
        for c in self.init_containers:
            if c.sidecar:
                await sidecars.start(self, c)
                if not c.started.is_set():
                    return False  # the pod is going away before its sidecar could run
                continue
            if c.exit_code != 0:
                await self.container_loop(c)
            if c.exit_code != 0:
                return False
        for c in self.containers:
            if c.state.get("waiting", {}).get("reason") == "PodInitializing":
                c.state = {"waiting": {"reason": "ContainerCreating"}}
        return True

    @property
    def all_containers(self) -> list[ContainerState]:
        return [*self.init_containers, *self.containers]

    def ending(self) -> bool:
        """Deleted, failed by the kubelet, or (for sidecars) the regular containers are done."""
        return self.deleting.is_set() or self.failure is not None or self.mains_done

    async def container_loop(self, c: ContainerState) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if c.init and policy == "Always":
            policy = "OnFailure"  # init containers are only restarted when they fail
        policy = "Always" if c.sidecar else policy
        backoff = BACKOFF_START_SECONDS
        while not self.ending():
            code, c.recovered = (c.recovered, None) if c.recovered is not None else (
                await self._run_once(c), None)
            if c.ran_seconds >= self.kubelet.scaled(2 * BACKOFF_MAX_SECONDS):
                backoff = BACKOFF_START_SECONDS  # a long healthy run resets the back-off
            if code is None:
                if not await self._sleep(backoff):
                    break
                backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
                continue
            if self.ending():
                break
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                break
            c.restart_count += 1
            c.last_state, c.state = {"terminated": c.state["terminated"]}, {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {int(backoff)}s restarting failed container={c.name} "
                           f"pod={pod_ref(self.pod)}"}}
            self.publish()
            self.kubelet.event(self.pod, "BackOff", f"Back-off restarting failed container "
                               f"{c.name} in pod {pod_ref(self.pod)}", warning=True,
                               container=c.name)
            if not await self._sleep(backoff):
                break
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
        c.done = True

    async def _sleep(self, seconds: float) -> bool:
        """A back-off wait that deletion cuts short; False when the pod is going away."""
        sleeper = asyncio.ensure_future(asyncio.sleep(self.kubelet.scaled(seconds)))
        self._sleepers.add(sleeper)
        try:
            await sleeper
        except asyncio.CancelledError:
            if not sleeper.cancelled():
                raise
        finally:
            self._sleepers.discard(sleeper)
        return not self.ending()

    async def _run_once(self, c: ContainerState) -> int | None:
        """One container instance; its exit code, or None when it could not start."""
        launch = self._prepare(c)
        if launch is None or isinstance(launch, int):
            return launch
        c.container_id = f"kubesim://{uuid.uuid4().hex}{uuid.uuid4().hex}"
        self._keep_two_logs(c)
        try:
            c.instance = await runtime.Container.start(launch, self.kubelet.memory,
                                                       c.container_id[-12:])
        except OSError as exc:
            return podstatus.start_failed(self, c, str(exc))
        if self.stop_grace is not None:
            # Deletion or eviction came while this instance was being started.
            stopping = asyncio.ensure_future(c.instance.stop(self.stop_grace))
            self._stoppers.add(stopping)
            stopping.add_done_callback(self._stoppers.discard)
        self.kubelet.event(self.pod, "Created", f"Created container: {c.name}", container=c.name)
        self.kubelet.event(self.pod, "Started", f"Started container {c.name}", container=c.name)
        c.state = {"running": {"startedAt": timestamp(c.instance.started_at.timestamp())}}
        c.started.set()
        self.publish()
        result = await c.instance.wait()
        c.instance = None
        c.ran_seconds = (result.finished_at - result.started_at).total_seconds()
        c.exit_code = result.exit_code
        c.state = {"terminated": podstatus.terminated(self, c, result)}
        self.publish()
        return result.exit_code

    def _prepare(self, c: ContainerState) -> runtime.Launch | int | None:
        """What to start; an exit code when starting failed; None to retry after back-off."""
        spec, pod, kubelet = c.spec, self.pod, self.kubelet
        image = spec.get("image", "")
        invalid = workload.image_error(image)
        if invalid is not None:
            podstatus.invalid_image(self, c, invalid)
            return None
        image_runtime = workload.resolve_image(kubelet.config.images, image)
        if image_runtime is None:
            podstatus.pull_failed(self, c, image)
            return None
        podstatus.pulled(self, c, image)
        container_dir = self.dir / c.name
        container_dir.mkdir(parents=True, exist_ok=True)
        hosts = kubelet.dns.write(pod, self.ip)  # before the first lookup can happen
        namespaced = mounts.available()
        try:
            folders = workload.prepare_volumes(kubelet.store, pod, self.dir, kubelet.config.root)
            binds = workload.mount_map(spec, folders, container_dir)
            if namespaced:  # the path can only be bound in a mount namespace of its own
                serviceaccount.bind(binds, kubelet.store, pod, kubelet.config.root, self.dir)
            extra = {**kubelet.dns.env(pod, hosts), **self._extra_env(binds)}
            env = workload.build_env(
                kubelet.store, pod, spec, extra,
                path_prefix=workload.host_python_path(kubelet.config.root, image_runtime))
            if not namespaced:
                env = {k: workload.rewrite(v, binds) for k, v in env.items()}
            argv = workload.build_argv(spec, image_runtime, env, binds,
                                       rewrite_paths=not namespaced)
        except workload.ConfigError as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            kubelet.event(pod, "Failed", f"Error: {exc}", warning=True, container=c.name)
            self.publish()
            return None
        except workload.StartError as exc:
            return podstatus.start_failed(self, c, str(exc))
        return self._launch(c, argv, env, binds, namespaced, workload.image_workdir(image_runtime))

    def _launch(self, c: ContainerState, argv: tuple[str, ...], env: dict[str, str],
                binds: dict[str, Path], namespaced: bool, image_workdir: str) -> runtime.Launch:
        container_dir = self.dir / c.name
        (container_dir / "termination-log").touch()
        # The container's workingDir, else its image's WORKDIR, else a folder of its own.
        work = c.spec.get("workingDir") or image_workdir
        cwd = container_dir / "rootfs"
        if not namespaced and work:
            cwd = Path(workload.rewrite(work, binds))
        elif work and not Path(workload.rewrite(work, binds)).exists():
            # Runtimes create a missing workingDir; here it is a folder of the container's.
            binds[work] = container_dir / "workdir"
            binds[work].mkdir(exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        limit = ((c.spec.get("resources") or {}).get("limits") or {}).get("memory")
        return runtime.Launch(
            argv=argv, env=env, cwd=cwd, name=c.name,
            log_path=container_dir / f"{c.restart_count}.log",
            memory_limit_bytes=int(workload.quantity(limit)) if limit else None,
            mounts=tuple((str(local), path) for path, local in binds.items())
            if namespaced else (), workdir=work if namespaced else "")

    def _extra_env(self, binds: dict[str, Path]) -> dict[str, str]:
        extra = workload.mount_env(binds)
        if self.kubelet.api_url:
            host, _, port = self.kubelet.api_url.rsplit("/", 1)[-1].rpartition(":")
            extra.update({"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
                          "KUBERNETES_SERVICE_PORT_HTTPS": port,
                          "KUBERNETES_PORT": f"tcp://{host}:{port}"})
        if self.gpus:
            devices = ",".join(str(g) for g in self.gpus)
            extra.update({"NVIDIA_VISIBLE_DEVICES": devices, "CUDA_VISIBLE_DEVICES": devices})
        return extra

    def _keep_two_logs(self, c: ContainerState) -> None:
        # Only the current and the previous instance's logs survive, as on a real node.
        stale = self.dir / c.name / f"{c.restart_count - 2}.log"
        with contextlib.suppress(OSError):
            stale.unlink()
        with contextlib.suppress(OSError):  # a fresh instance starts with an empty message
            (self.dir / c.name / "termination-log").write_text("")

    # -- termination ---------------------------------------------------------------------------

    async def stop_containers(self, grace_seconds: float) -> None:
        """SIGTERM, then SIGKILL after the grace period: regular containers, then sidecars."""
        self.stop_grace = grace = self.kubelet.termination_grace(grace_seconds)
        started, stops = time.monotonic(), []
        for c in self.all_containers:
            if c.instance is not None and not c.sidecar:
                self.kubelet.event(self.pod, "Killing", f"Stopping container {c.name}",
                                   container=c.name)
                stops.append(c.instance.stop(grace))
        await asyncio.gather(*stops)
        await sidecars.stop(self, max(grace - (time.monotonic() - started), 0.0))

    async def _terminate(self) -> None:
        """All container loops ended: report the terminal phase, then let the object go."""
        self.finished = True
        self.publish()
        if self.deleting.is_set():
            finalize_deletion(self.kubelet, self.pod)

    async def watch_deletion(self) -> None:
        await self.deleting.wait()
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        await self.stop_containers(float(grace))

    def publish(self) -> None:
        """Write the pod status derived from the container states (lost while partitioned)."""
        if not self.kubelet.connected:
            return
        meta = self.pod["metadata"]
        status = podstatus.build(self)
        self.kubelet.store.mutate("pods", meta["namespace"], meta["name"],
                                  lambda pod: podstatus.apply(pod, status))
