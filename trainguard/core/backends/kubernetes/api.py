"""The one module that imports `kubernetes`: a small client over BatchV1Api and CoreV1Api.

Everything crosses this edge in Kubernetes wire form (plain dicts with camelCase keys, exactly
what `kubectl get -o json` prints), so the rest of trainguard never touches the client's models.
Client exceptions are translated once here into `trainguard.core.backends.kubernetes.errors` (404 → NotFound,
409 → Conflict, 401/403 → Forbidden, 410 → Expired, 400/422 → Invalid, 429/5xx/connection →
Transient), chained `from exc`. Transient errors are retried with a capped exponential backoff;
sleep and clock are injected so tests need no patching.

What does not belong here: what a Job looks like (manifests.py), how an attempt is supervised
(supervise.py, watch.py) and what evidence is kept (evidence.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import kubernetes.client as k8s
import kubernetes.config as k8s_config
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from trainguard.core.backends.kubernetes.errors import Forbidden, KubeError, Transient, from_status

T = TypeVar("T")
Wire = dict[str, Any]

# Connect and read timeouts of one ordinary request (seconds); streams set their own.
PYTORCHJOBS = ("kubeflow.org", "v1", "pytorchjobs")  # group, version, plural of the training operator's jobs
REQUEST_TIMEOUT = (5.0, 30.0)
STREAM_CHUNK_BYTES = 64 * 1024
LOG_READ_TIMEOUT = (5.0, 120.0)  # connect, then per read: a whole log of a busy node may come slowly

_CONNECTION_ERRORS = (
    urllib3.exceptions.HTTPError,  # MaxRetryError, ProtocolError, ReadTimeoutError, NewConnectionError
    ConnectionError,
    TimeoutError,
)


@dataclass(frozen=True)
class RetrySettings:
    """How transient API errors are retried: attempts in all, first delay, cap."""

    attempts: int = 6
    first_delay_seconds: float = 0.2
    max_delay_seconds: float = 5.0


def translate(exc: BaseException, what: str) -> KubeError:
    """The trainguard error for a client exception, with a one-line message naming the call."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        reason, message = str(exc.reason or ""), ""
        try:
            body = json.loads(exc.body or "{}")
            reason, message = str(body.get("reason") or reason), str(body.get("message") or "")
        except (ValueError, AttributeError):
            message = str(exc.body or "")[:300]
        return from_status(status, f"{what}: {status} {reason}: {message}".rstrip(": "), reason)
    return Transient(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")


class KubeApi:
    """Jobs, Services, pods, logs, events, nodes, ConfigMaps and the attempts' Secrets of one cluster, in wire form.

    Build one with `from_kubeconfig`, `from_config_dict` or `in_cluster`; tests may pass any
    `kubernetes.client.ApiClient`.
    """

    def __init__(
        self, api_client: Any, *, retry: RetrySettings = RetrySettings(),
        sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api_client = api_client
        self.batch = k8s.BatchV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.retry, self.sleep, self.clock = retry, sleep, clock

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None, **kwargs: Any) -> KubeApi:
        """A client from a kubeconfig file (the default location when `path` is None)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
        except (ConfigException, OSError, ValueError) as exc:
            raise Forbidden(f"kubeconfig {path or '~/.kube/config'}: {exc}; check the path and --context") from exc
        return cls(_client(configuration), **kwargs)

    @classmethod
    def from_config_dict(cls, config: Mapping[str, Any], context: str | None = None, **kwargs: Any) -> KubeApi:
        """A client from a kubeconfig already loaded as a dict (as KubernetesClusterConfig stores it)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_kube_config_from_dict(dict(config), context=context, client_configuration=configuration)
        except (ConfigException, ValueError) as exc:
            raise Forbidden(f"cluster config (context {context!r}): {exc}") from exc
        return cls(_client(configuration), **kwargs)

    @classmethod
    def in_cluster(cls, **kwargs: Any) -> KubeApi:
        """A client from the pod's service account (in-cluster config)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except ConfigException as exc:
            raise Forbidden(f"in-cluster config: {exc}; run inside a pod or give a kubeconfig") from exc
        return cls(_client(configuration), **kwargs)

    # -- the edge: every call goes through here -------------------------------------------

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call `fn`, translating errors and retrying transient ones with backoff."""
        delay = self.retry.first_delay_seconds
        for attempt in range(1, self.retry.attempts + 1):
            try:
                try:
                    return fn(*args, **kwargs)
                except (ApiException, *_CONNECTION_ERRORS) as exc:
                    raise translate(exc, what) from exc
            except Transient:
                if attempt >= self.retry.attempts:
                    raise
                self.sleep(delay)
                delay = min(delay * 2, self.retry.max_delay_seconds)
        raise AssertionError("unreachable")  # pragma: no cover

    def _json(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Wire:
        def once() -> Wire:
            response = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
            data: Wire = json.loads(response.data or b"{}")
            return data

        return self.call(what, once)

    # -- Jobs -----------------------------------------------------------------------------

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> Wire:
        name = body.get("metadata", {}).get("name", "?")
        return self._json(f"create job {namespace}/{name}", self.batch.create_namespaced_job, namespace, dict(body))

    def read_job(self, namespace: str, name: str) -> Wire:
        return self._json(f"read job {namespace}/{name}", self.batch.read_namespaced_job, name, namespace)

    def list_jobs(self, namespace: str, label_selector: str | None = None) -> Wire:
        return self._json(f"list jobs in {namespace}", self.batch.list_namespaced_job, namespace,
                          label_selector=label_selector or "")

    def delete_job(self, namespace: str, name: str, propagation: str = "Background") -> Wire:
        """Delete a Job and its pods, in the background or (`Foreground`) before the Job itself goes
        (Jobs orphan their pods by default)."""
        return self._json(f"delete job {namespace}/{name}", self.batch.delete_namespaced_job, name, namespace,
                          body={"propagationPolicy": propagation})

    def patch_job_ttl(self, namespace: str, name: str, ttl_seconds: int) -> Wire:
        """Set `ttlSecondsAfterFinished`, so the cluster deletes the finished Job after that long."""
        body = {"spec": {"ttlSecondsAfterFinished": int(ttl_seconds)}}
        return self._json(f"patch job {namespace}/{name}", self.batch.patch_namespaced_job, name, namespace, body)

    def resume_job(self, namespace: str, name: str) -> Wire:
        """Set `suspend: false`: the Job controller creates its pod now."""
        body = {"spec": {"suspend": False}}
        return self._json(f"patch job {namespace}/{name}", self.batch.patch_namespaced_job, name, namespace, body)

    # -- Kubeflow PyTorchJobs (kubeflow.org/v1), for clusters that run the training operator --

    def create_pytorchjob(self, namespace: str, body: Mapping[str, Any]) -> Wire:
        name = body.get("metadata", {}).get("name", "?")
        return self._json(f"create pytorchjob {namespace}/{name}", self.custom.create_namespaced_custom_object,
                          *PYTORCHJOBS[:2], namespace, PYTORCHJOBS[2], dict(body))

    def read_pytorchjob(self, namespace: str, name: str) -> Wire:
        return self._json(f"read pytorchjob {namespace}/{name}", self.custom.get_namespaced_custom_object,
                          *PYTORCHJOBS[:2], namespace, PYTORCHJOBS[2], name)

    def list_pytorchjobs(self, namespace: str, label_selector: str | None = None) -> Wire:
        return self._json(f"list pytorchjobs in {namespace}", self.custom.list_namespaced_custom_object,
                          *PYTORCHJOBS[:2], namespace, PYTORCHJOBS[2], label_selector=label_selector or "")

    def delete_pytorchjob(self, namespace: str, name: str, propagation: str = "Background") -> Wire:
        return self._json(f"delete pytorchjob {namespace}/{name}", self.custom.delete_namespaced_custom_object,
                          *PYTORCHJOBS[:2], namespace, PYTORCHJOBS[2], name, body={"propagationPolicy": propagation})

    def patch_pytorchjob(self, namespace: str, name: str, run_policy: Mapping[str, Any]) -> Wire:
        """Merge ``run_policy`` into the job's `runPolicy` (`ttlSecondsAfterFinished`, `suspend`)."""
        body = {"spec": {"runPolicy": dict(run_policy)}}
        return self._json(f"patch pytorchjob {namespace}/{name}", self.custom.patch_namespaced_custom_object,
                          *PYTORCHJOBS[:2], namespace, PYTORCHJOBS[2], name, body)

    # -- The headless Service of a multi-node attempt -------------------------------------

    def create_service(self, namespace: str, body: Mapping[str, Any]) -> Wire:
        name = body.get("metadata", {}).get("name", "?")
        return self._json(f"create service {namespace}/{name}", self.core.create_namespaced_service, namespace,
                          dict(body))

    def read_service(self, namespace: str, name: str) -> Wire:
        return self._json(f"read service {namespace}/{name}", self.core.read_namespaced_service, name, namespace)

    def delete_service(self, namespace: str, name: str) -> Wire:
        return self._json(f"delete service {namespace}/{name}", self.core.delete_namespaced_service, name, namespace)

    # -- Pods and logs --------------------------------------------------------------------

    def list_pods(self, namespace: str, label_selector: str | None = None, field_selector: str | None = None) -> Wire:
        return self._json(f"list pods in {namespace}", self.core.list_namespaced_pod, namespace,
                          label_selector=label_selector or "", field_selector=field_selector or "")

    def read_pod(self, namespace: str, name: str) -> Wire:
        return self._json(f"read pod {namespace}/{name}", self.core.read_namespaced_pod, name, namespace)

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> Wire:
        name = body.get("metadata", {}).get("name", "?")
        return self._json(f"create pod {namespace}/{name}", self.core.create_namespaced_pod, namespace, dict(body))

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> Wire:
        extra = {} if grace_seconds is None else {"grace_period_seconds": grace_seconds}
        return self._json(f"delete pod {namespace}/{name}", self.core.delete_namespaced_pod, name, namespace, **extra)

    def read_pod_log(
        self, namespace: str, name: str, container: str | None = None, *, previous: bool = False,
        since_seconds: int | None = None, limit_bytes: int | None = None, tail_lines: int | None = None,
        timestamps: bool = False,
    ) -> bytes:
        """A container's log as raw bytes (never decoded: logs need not be UTF-8)."""
        options = _log_options(container, previous, since_seconds, limit_bytes, tail_lines, timestamps)

        def once() -> bytes:
            response = self.core.read_namespaced_pod_log(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **options)
            return bytes(response.data or b"")

        return self.call(f"read log of {namespace}/{name}{'/' + container if container else ''}", once)

    def stream_pod_log(
        self, namespace: str, name: str, container: str | None = None, *, since_seconds: int | None = None,
        read_timeout_seconds: float = 60.0,
    ) -> Iterator[bytes]:
        """Follow a container's log, yielding raw chunks until it ends; errors are translated.

        Not retried here: a caller that resumes knows how much it has already seen.
        """
        what = f"follow log of {namespace}/{name}"
        options = _log_options(container, False, since_seconds, None, None, False)
        response = self.call(what, self.core.read_namespaced_pod_log, name, namespace, follow=True,
                             _preload_content=False, _request_timeout=(5.0, read_timeout_seconds), **options)
        return _chunks(response, what)

    def save_pod_log(self, namespace: str, name: str, container: str, *, previous: bool, out: Path) -> int:
        """Write one container instance's whole log to ``out`` chunk by chunk; return its size in bytes.

        Unlike `read_pod_log` the body is never held in memory (a log may be gigabytes). The request is
        retried like any call; a connection cut mid-body is an `OSError` saying how far it got.
        """
        what = f"read {'previous ' if previous else ''}log of {namespace}/{name}/{container}"
        response = self.call(what, self.core.read_namespaced_pod_log, name, namespace, container=container,
                             previous=previous, _preload_content=False, _request_timeout=LOG_READ_TIMEOUT)
        size = 0
        try:
            with out.open("wb") as handle:
                for chunk in response.stream(STREAM_CHUNK_BYTES, decode_content=False):
                    handle.write(chunk)
                    size += len(chunk)
        except Exception as exc:  # urllib3's, http.client's or the socket's own words for a cut body
            raise OSError(f"{what}: the connection broke after {size} bytes: {type(exc).__name__}") from exc
        finally:
            response.release_conn()
        return size

    # -- Events, nodes, ConfigMaps --------------------------------------------------------

    def list_events(self, namespace: str, field_selector: str | None = None) -> Wire:
        return self._json(f"list events in {namespace}", self.core.list_namespaced_event, namespace,
                          field_selector=field_selector or "")

    def read_node(self, name: str) -> Wire:
        return self._json(f"read node {name}", self.core.read_node, name)

    def list_nodes(self, label_selector: str | None = None) -> Wire:
        return self._json("list nodes", self.core.list_node, label_selector=label_selector or "")

    def create_secret(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create a Secret. Nothing is returned: the answer echoes the values, which no caller needs."""
        name = body.get("metadata", {}).get("name", "?")
        self._json(f"create secret {namespace}/{name}", self.core.create_namespaced_secret, namespace, dict(body))

    def create_config_map(self, namespace: str, body: Mapping[str, Any]) -> Wire:
        name = body.get("metadata", {}).get("name", "?")
        return self._json(f"create configmap {namespace}/{name}", self.core.create_namespaced_config_map,
                          namespace, dict(body))

    # -- Watches --------------------------------------------------------------------------

    def watch(
        self, resource: str, namespace: str, *, resource_version: str | None = None,
        label_selector: str | None = None, field_selector: str | None = None, timeout_seconds: int = 30,
    ) -> Iterator[Wire]:
        """Raw watch events (`{"type", "object"}`) of `jobs`, `pytorchjobs` or `pods` until the server ends the stream.

        An ERROR event is raised as its error (410 → Expired); a cut connection as Transient.
        Resuming is `trainguard.core.backends.kubernetes.watch`'s business.
        """
        lister = {"jobs": self.batch.list_namespaced_job, "pods": self.core.list_namespaced_pod,
                  "pytorchjobs": partial(self.custom.list_namespaced_custom_object, *PYTORCHJOBS[:2], plural=PYTORCHJOBS[2])
                  }[resource]
        what = f"watch {resource} in {namespace}"
        response = self.call(
            what, lister, namespace, watch=True, allow_watch_bookmarks=True, resource_version=resource_version or "",
            label_selector=label_selector or "", field_selector=field_selector or "", timeout_seconds=timeout_seconds,
            _preload_content=False, _request_timeout=(5.0, timeout_seconds + 15.0),
        )
        return _watch_events(_lines(_chunks(response, what)), what)

    def close(self) -> None:
        """Release the connection pool."""
        self.api_client.close()


# Connections kept for reuse. The client's default is 5 per core of the flow host (10 on 2 cores), and
# urllib3 warns at each connection it drops beyond it: a multi-node attempt follows every pod's log
# at once, beside its watch and its calls. Idle connections cost a socket each.
POOL_CONNECTIONS = 64


def _client(configuration: Any) -> Any:
    """An ApiClient whose urllib3 layer does not retry (`KubeApi.call` is the one retry policy) and keeps
    up to `POOL_CONNECTIONS` connections."""
    configuration.retries = False
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, POOL_CONNECTIONS)
    return k8s.ApiClient(configuration)


def _log_options(
    container: str | None, previous: bool, since_seconds: int | None, limit_bytes: int | None,
    tail_lines: int | None, timestamps: bool,
) -> dict[str, Any]:
    options: dict[str, Any] = {"previous": previous, "timestamps": timestamps}
    for key, value in (("container", container), ("since_seconds", since_seconds),
                       ("limit_bytes", limit_bytes), ("tail_lines", tail_lines)):
        if value is not None:
            options[key] = value
    return options


def _chunks(response: Any, what: str) -> Iterator[bytes]:
    """A streaming response's chunks; a cut connection becomes Transient; always released."""
    try:
        for chunk in response.stream(STREAM_CHUNK_BYTES, decode_content=False):
            if chunk:
                yield bytes(chunk)
    except _CONNECTION_ERRORS as exc:
        raise Transient(f"{what}: connection lost: {type(exc).__name__}") from exc
    finally:
        response.release_conn()


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


def _watch_events(lines: Iterator[bytes], what: str) -> Iterator[Wire]:
    for line in lines:
        try:
            event: Wire = json.loads(line)
        except ValueError as exc:
            raise Transient(f"{what}: unreadable watch event") from exc
        if event.get("type") == "ERROR":
            status = event.get("object") or {}
            raise from_status(int(status.get("code") or 500), f"{what}: {status.get('message', 'watch error')}",
                              str(status.get("reason") or ""))
        yield event
