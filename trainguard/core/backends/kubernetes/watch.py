"""A watch that survives: list, then watch from the list's resourceVersion, resume after a drop.

The API server ends every watch sooner or later (its timeout, a restart, a cut connection) and may
have forgotten an old resourceVersion (410 Expired). `ResumingWatch` hides both: after a clean end
or a dropped connection it watches again from the last resourceVersion it saw (bookmarks count);
after a 410 it lists again and hands the fresh state to the caller as a `RELISTED` batch, so no
change is missed either way. Only the client calls of `KubeApi` are used, so it needs no
`kubernetes` import.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from trainguard.core.backends.kubernetes.errors import Expired, Transient

Wire = dict[str, Any]
RELISTED = "RELISTED"  # a synthetic event: `object` is the full list (kind *List) just read


class WatchApi(Protocol):
    """The part of `KubeApi` a watch needs."""

    def list_jobs(self, namespace: str, label_selector: str | None = None) -> Wire: ...
    def list_pytorchjobs(self, namespace: str, label_selector: str | None = None) -> Wire: ...
    def list_pods(self, namespace: str, label_selector: str | None = None,
                  field_selector: str | None = None) -> Wire: ...
    def watch(self, resource: str, namespace: str, *, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_seconds: int = 30) -> Iterator[Wire]: ...


@dataclass
class WatchStats:
    """What happened to the watch, for logs and tests."""

    lists: int = 0
    watches: int = 0
    drops: int = 0
    expired: int = 0


class ResumingWatch:
    """Events of one resource kind matching a label selector, across drops and 410s.

    Iterating yields `{"type": RELISTED, "object": <list>}` first (the current state), then the
    server's ADDED/MODIFIED/DELETED events; BOOKMARKs only move the resume point. Iteration never
    ends on its own: the caller stops when it has what it waits for. Given `resource_version` (a
    state the caller already holds, e.g. the object it just created), it skips the first list and
    watches from there: one request instead of two.
    """

    def __init__(
        self, api: WatchApi, resource: str, namespace: str, label_selector: str, *,
        timeout_seconds: int = 30, sleep: Callable[[float], None] = time.sleep,
        max_delay_seconds: float = 5.0, resource_version: str | None = None,
    ) -> None:
        self.api, self.resource, self.namespace, self.selector = api, resource, namespace, label_selector
        self.timeout_seconds, self.sleep, self.max_delay_seconds = timeout_seconds, sleep, max_delay_seconds
        self.resource_version: str | None = resource_version
        self.stats = WatchStats()

    def relist(self) -> Wire:
        """List now and remember the list's resourceVersion as the resume point."""
        if self.resource == "jobs":
            listing = self.api.list_jobs(self.namespace, self.selector)
        elif self.resource == "pytorchjobs":
            listing = self.api.list_pytorchjobs(self.namespace, self.selector)
        else:
            listing = self.api.list_pods(self.namespace, self.selector)
        self.stats.lists += 1
        self.resource_version = str(listing.get("metadata", {}).get("resourceVersion") or "") or None
        return listing

    def __iter__(self) -> Iterator[Wire]:
        if self.resource_version is None:
            yield {"type": RELISTED, "object": self.relist()}
        delay = 0.1
        while True:
            try:
                self.stats.watches += 1
                for event in self.api.watch(self.resource, self.namespace, resource_version=self.resource_version,
                                            label_selector=self.selector, timeout_seconds=self.timeout_seconds):
                    delay = 0.1
                    version = event.get("object", {}).get("metadata", {}).get("resourceVersion")
                    if version:
                        self.resource_version = str(version)
                    if event.get("type") != "BOOKMARK":
                        yield event
            except Expired:
                self.stats.expired += 1
                yield {"type": RELISTED, "object": self.relist()}
            except Transient:
                self.stats.drops += 1
                self.sleep(delay)
                delay = min(delay * 2, self.max_delay_seconds)
