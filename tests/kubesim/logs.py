"""The pods/log subresource: read the kubelet's CRI log files with the kubelet's options.

Files live at `<root>/pods/<ns>_<pod>_<uid>/<container>/<restartCount>.log`, one per container
instance, lines `<RFC3339Nano> stdout|stderr F|P <text>`. Writing them is the kubelet's job.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from kubesim.errors import BadRequest, NotFound
from kubesim.store import Store

_FOLLOW_POLL_SECONDS = 0.1


def log_path(root: Path, pod: dict[str, Any], container: str, restart: int) -> Path:
    """Where the kubelet keeps one container instance's log."""
    meta = pod["metadata"]
    return (root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
            / f"{restart}.log")


def _container(pod: dict[str, Any], wanted: str | None) -> str:
    spec = pod.get("spec") or {}
    names: list[str] = [c["name"] for c in spec.get("containers") or []]
    all_names = names + [c["name"] for c in spec.get("initContainers") or []]
    pod_name = pod["metadata"]["name"]
    if wanted is None:
        if len(names) == 1:
            return names[0]
        raise BadRequest(f"a container name must be specified for pod {pod_name}, choose one "
                         f"of: [{' '.join(names)}]")
    if wanted not in all_names:
        raise BadRequest(f"container {wanted} is not valid for pod {pod_name}")
    return wanted


def _status_of(pod: dict[str, Any], container: str) -> dict[str, Any] | None:
    status = pod.get("status") or {}
    for s in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses")
                                                        or []):
        if s.get("name") == container:
            return s  # type: ignore[no-any-return]
    return None


# Waiting reasons the kubelet words for people rather than echoing (validateContainerLogStatus).
_PULL_WORDING = {"ErrImagePull": "image can't be pulled",
                 "ImagePullBackOff": "trying and failing to pull image"}


def _instance(root: Path, pod: dict[str, Any], container: str,
              previous: bool) -> tuple[Path, bool]:
    """The log file the kubelet would pick (validateContainerLogStatus), and whether it is live.

    A running or terminated instance is preferred; otherwise the last terminated one, which is
    why a container waiting in CrashLoopBackOff still shows the crashed run's output.
    """
    name, status = pod["metadata"]["name"], _status_of(pod, container)
    if status is None:
        raise BadRequest(f'container "{container}" in pod "{name}" is not available')
    restarts = int(status.get("restartCount") or 0)
    state, last = status.get("state") or {}, (status.get("lastState") or {}).get("terminated")
    # The instance that ended last is restartCount - 1 once the kubelet has counted the restart.
    last_path = log_path(root, pod, container, restarts - 1) if restarts >= 1 else None
    if previous:
        if not last or last_path is None or not last_path.exists():
            raise BadRequest(f'previous terminated container "{container}" in pod "{name}" '
                             "not found")
        return last_path, False
    # A terminated state without a containerID is an instance that never started.
    if "running" in state or (state.get("terminated") or {}).get("containerID"):
        return log_path(root, pod, container, restarts), True
    if last or "terminated" in state:
        if not last or last_path is None or not last_path.exists():
            raise BadRequest(f'container "{container}" in pod "{name}" is terminated')
        return last_path, False
    if "waiting" in state:
        reason = (state["waiting"] or {}).get("reason") or ""
        raise BadRequest(f'container "{container}" in pod "{name}" is waiting to start: '
                         f"{_PULL_WORDING.get(reason, reason)}")
    raise BadRequest(f'container "{container}" in pod "{name}" is waiting to start - no logs yet')


def records(text: str) -> list[str]:
    """The CRI records of a log file's text, each with its newline: split at "\\n" only, as the
    kubelet does (a record's text keeps the "\\r" of a progress bar, which `splitlines` would cut)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def parse_line(raw: str) -> tuple[str, str, bool, str] | None:
    parts = raw.rstrip("\n").split(" ", 3)
    if len(parts) < 3:
        return None
    text = parts[3] if len(parts) == 4 else ""
    return parts[0], parts[1], parts[2] == "P", text


def _ts(value: str) -> float:
    head, _, frac = value.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head + "+00:00").timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def render(raw_lines: list[str], query: dict[str, str]) -> str:
    """Turn CRI lines into the text the API returns under the query's options."""
    since = None
    if "sinceSeconds" in query:
        since = datetime.now().timestamp() - int(query["sinceSeconds"])
    elif "sinceTime" in query:
        since = _ts(query["sinceTime"])
    stamps = query.get("timestamps", "") in ("true", "1", "True")
    out: list[str] = []
    for raw in raw_lines:
        parsed = parse_line(raw)
        if parsed is None:
            continue
        at, _stream, partial, text = parsed
        if since is not None and _ts(at) < since:
            continue
        out.append((f"{at} " if stamps else "") + text + ("" if partial else "\n"))
    if "tailLines" in query:
        tail = int(query["tailLines"])
        out = out[-tail:] if tail > 0 else []
    text = "".join(out)
    if "limitBytes" in query:
        text = text.encode()[: int(query["limitBytes"])].decode(errors="ignore")
    return text


async def serve(request: web.Request, store: Store, root: Path, namespace: str,
                name: str) -> web.StreamResponse:
    """GET .../pods/{name}/log."""
    query = dict(request.query)
    pod = store.get("pods", namespace, name)
    if pod is None:
        raise NotFound.of("pods", name)
    container = _container(pod, query.get("container"))
    previous = query.get("previous", "") in ("true", "1", "True")
    path, live = _instance(root, pod, container, previous)
    # bytes, then text: reading as text would turn the "\r" of a progress bar into a newline
    lines = records(path.read_bytes().decode(errors="replace")) if path.exists() else []
    text = render(lines, query)
    # Following an instance that has already ended returns what it wrote, as for a dead runtime
    # container.
    if not live or query.get("follow", "") not in ("true", "1", "True"):
        return web.Response(text=text, content_type="text/plain")
    return await _follow(request, store, path, pod, container, text, query)


def _terminated(store: Store, pod: dict[str, Any], container: str) -> bool:
    # Every follower asks this ten times a second: a deep copy each time would cost 50 followers
    # a good part of a core.
    current = store.peek("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
    if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
        return True
    status = _status_of(current, container) or {}
    return "terminated" in (status.get("state") or {})


async def _follow(request: web.Request, store: Store, path: Path, pod: dict[str, Any],
                  container: str, first: str, query: dict[str, str]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    await response.write(first.encode())
    offset = path.stat().st_size if path.exists() else 0
    passthrough = {k: v for k, v in query.items() if k == "timestamps"}
    while True:
        done = _terminated(store, pod, container)
        if path.exists() and path.stat().st_size > offset:
            with path.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            offset += len(complete)
            lines = records(complete.decode(errors="replace"))
            await response.write(render(lines, passthrough).encode())
        if done:
            break
        await asyncio.sleep(_FOLLOW_POLL_SECONDS)
    await response.write_eof()
    return response
