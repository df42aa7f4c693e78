"""An attempt's pods seen to their end before anything of the next attempt starts.

A Job that failed (or was deleted) leaves its other pods terminating within their grace: a survivor
still saving a just-in-time or notice checkpoint, a rank still holding its GPU and its rendezvous
port. The next attempt's checkpoint choice must see what those saves leave, and its pods must not
meet the old ones on a node (Kubernetes' own Job controller waits in the same way with
`podReplacementPolicy: Failed`). So `release` waits for them, up to their termination grace and a
margin; `tasks.evidence.release_attempt` says what it waits for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from trainguard.core.backends.kubernetes.api import KubeApi
from trainguard.core.backends.kubernetes.collector import COMPONENT
from trainguard.core.backends.kubernetes.errors import KubeError
from trainguard.core.backends.kubernetes.manifests import LABEL_COMPONENT
from trainguard.core.backends.waits import span

DEFAULT_GRACE_SECONDS = 30  # the API's default terminationGracePeriodSeconds
MARGIN_SECONDS = 15.0  # past the longest grace: the kubelet reports, the API server removes
POLL_SECONDS = 0.25


def still_running(pods: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The training pods that have not ended: neither Succeeded nor Failed (a terminating pod still runs).

    trainguard's own helper pods of the attempt (the evidence collector) are not waited for.
    """
    return [pod for pod in pods if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_COMPONENT) != COMPONENT]


def _grace(pod: Mapping[str, Any]) -> float:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    grace = meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds"))
    return float(grace) if isinstance(grace, int | float) else float(DEFAULT_GRACE_SECONDS)


def wait_ended(api: KubeApi, namespace: str, selector: str, *,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Return once no pod of ``selector`` is running; None then, else why it stopped waiting.

    Bounded by the longest termination grace among the pods still running, plus `MARGIN_SECONDS`.
    A failing API ends the wait at once (the next attempt is not held up by the cluster's records).
    """
    started, deadline = clock(), None
    while True:
        try:
            running = still_running(api.list_pods(namespace, label_selector=selector).get("items") or [])
        except KubeError as exc:
            return f"could not see whether the attempt's pods ended: {exc}"
        if not running:
            return None
        now = clock()
        if deadline is None:
            deadline = now + max(_grace(pod) for pod in running) + MARGIN_SECONDS
        names = ", ".join(sorted(str((pod.get("metadata") or {}).get("name")) for pod in running))
        if now >= deadline:
            return f"pods {names} still running {span(now - started)} after the attempt ended; going on without them"
        sleep(POLL_SECONDS)
