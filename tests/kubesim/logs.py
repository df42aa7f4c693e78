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


def _instance(root: Path, pod: dict[str, Any], container: str, previous: bool) -> Path:
    name, status = pod["metadata"]["name"], _status_of(pod, container)
    restarts = int((status or {}).get("restartCount") or 0)
    if previous:
        path = log_path(root, pod, container, restarts - 1)
        if status is None or not (status.get("lastState") or {}).get("terminated") \
                or restarts < 1 or not path.exists():
            raise BadRequest(f'previous terminated container "{container}" in pod "{name}" '
                             "not found")
        return path
    waiting = ((status or {}).get("state") or {}).get("waiting")
    path = log_path(root, pod, container, restarts)
    if status is None or (waiting and not path.exists()):
        reason = (waiting or {}).get("reason") or "ContainerCreating"
        if reason in ("ErrImagePull", "ImagePullBackOff"):
            reason = "trying and failing to pull image"
        raise BadRequest(f'container "{container}" in pod "{name}" is waiting to start: {reason}')
    return path


def _parse_line(raw: str) -> tuple[str, str, bool, str] | None:
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
        parsed = _parse_line(raw)
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
    path = _instance(root, pod, container, previous)
    lines = path.read_text(errors="replace").splitlines(keepends=True) if path.exists() else []
    text = render(lines, query)
    if previous or query.get("follow", "") not in ("true", "1", "True"):
        return web.Response(text=text, content_type="text/plain")
    return await _follow(request, store, path, pod, container, text, query)


def _terminated(store: Store, pod: dict[str, Any], container: str) -> bool:
    current = store.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
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
            lines = complete.decode(errors="replace").splitlines(keepends=True)
            await response.write(render(lines, passthrough).encode())
        if done:
            break
        await asyncio.sleep(_FOLLOW_POLL_SECONDS)
    await response.write_eof()
    return response
