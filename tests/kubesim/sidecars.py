"""Native sidecars: init containers with `restartPolicy: Always` (KEP-753, on by default since 1.29).

What belongs here: what sets a sidecar apart from the other containers of its pod. It starts in
the init sequence, and the next init container (or the regular containers) starts as soon as it
is running: kubesim has no startupProbe to wait for. It runs beside the regular containers and
is restarted whenever it exits, whatever its exit code and the pod's restartPolicy, with the usual
CrashLoopBackOff back-off (10 s doubling, times the cluster's time_scale) and the previous
instance's log kept. It does not hold the pod up: once every regular container has ended the
sidecars get SIGTERM, in the reverse order of their declaration, and SIGKILL when the pod's
termination grace period runs out; the pod's phase comes from the regular containers alone.
On deletion the regular containers are stopped first, the sidecars after them.

What does not: the loop that runs and restarts one container (podworker.py), what the status
shows (podstatus.py: `started`/`ready` of sidecars, the Initialized and ContainersReady
conditions).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubesim.podstatus import ContainerState
    from kubesim.podworker import PodWorker


def is_sidecar(spec: dict[str, Any]) -> bool:
    """An init container the kubelet keeps restarting (`restartPolicy: Always`)."""
    return spec.get("restartPolicy") == "Always"


async def start(worker: PodWorker, c: ContainerState) -> None:
    """Start a sidecar's loop and return once it runs (or can never run: pod ending, loop over).

    A sidecar that cannot start (image pull, config error) holds the init sequence up, as on a
    node: its loop keeps retrying while this waits.
    """
    loop = asyncio.ensure_future(worker.container_loop(c))
    worker.sidecar_tasks.append(loop)
    started = asyncio.ensure_future(c.started.wait())
    ending = asyncio.ensure_future(worker.deleting.wait())
    try:
        await asyncio.wait({loop, started, ending}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        started.cancel()
        ending.cancel()


async def finish(worker: PodWorker) -> None:
    """The regular containers have ended: stop the sidecars, last declared first, and wait."""
    worker.mains_done = True
    worker.wake()
    grace = float(worker.pod["spec"].get("terminationGracePeriodSeconds", 30))
    await stop(worker, worker.kubelet.termination_grace(grace))
    await asyncio.gather(*worker.sidecar_tasks, return_exceptions=True)


async def stop(worker: PodWorker, grace_seconds: float) -> None:
    """SIGTERM the running sidecars one after the other, within one shared grace period."""
    if worker.stop_grace is None:
        worker.stop_grace = grace_seconds  # an instance starting right now is stopped at once
    deadline = time.monotonic() + grace_seconds
    for c in reversed([c for c in worker.init_containers if c.sidecar]):
        if c.instance is not None:
            worker.kubelet.event(worker.pod, "Killing", f"Stopping container {c.name}",
                                 container=c.name)
            await c.instance.stop(max(deadline - time.monotonic(), 0.0))
