"""Cluster DNS for containers that are host processes: one hosts file per pod, kept current.

Kubernetes gives each pod a kubelet-written /etc/hosts (localhost and the pod's own
`<ip> <fqdn> <hostname>` line) and a resolver searching `<ns>.svc.cluster.local svc.cluster.local
cluster.local` against cluster DNS, which answers for headless Services and, through their
endpoints, for `<hostname>.<subdomain>` of each selected pod whose spec.subdomain names the
Service (DNS for Services and Pods, and pkg/kubelet's hosts file, 1.32). Here a pod's processes
run with LD_PRELOAD=libnss_wrapper.so and NSS_WRAPPER_HOSTS pointing at `<pod dir>/hosts`, which
holds both parts, each name spelled as the search path would complete it (`svc` and
`host.svc` only inside the namespace; `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`
everywhere), each address as `127.x.y.z` and `::ffff:127.x.y.z` (c10d's TCPStore client asks for
IPv6 too and times out without an answer). NSS_WRAPPER_HOSTNAME makes gethostname() the pod's.

Files are replaced atomically whenever pods or Services change, so a lookup sees the new
records at once; a record exists only while its pod is ready (or the Service publishes
not-ready addresses), as with real endpoints.

Not emulated: Services with a cluster IP (no kube-proxy, so their names do not resolve), SRV
records, ExternalName, DNS for pods without a Service (`<ip-with-dashes>.<ns>.pod`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubesim import network, services
from kubesim.store import Store

CLUSTER_DOMAIN = "cluster.local"
_DEBOUNCE_SECONDS = 0.02


@dataclass(frozen=True)
class Record:
    """One address and the names that lead to it."""

    namespace: str
    ip: str
    everywhere: tuple[str, ...]  # fully or namespace-qualified names
    local: tuple[str, ...]  # names completed by the `<ns>.svc.cluster.local` search domain


def hostname(pod: dict[str, Any]) -> str:
    """The pod's hostname: spec.hostname, else its name cut to 63 characters (the kubelet's)."""
    explicit = (pod.get("spec") or {}).get("hostname")
    return str(explicit) if explicit else pod["metadata"]["name"][:63].rstrip("-.")


def records(store: Store) -> list[Record]:
    """What cluster DNS answers now, from headless Services and their endpoints."""
    found: list[Record] = []
    headless = [s for s in store.view("services") if services.headless(s)]
    if not headless:
        return found
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    for pod in store.view("pods"):  # one pass: the store holds every test's objects at once
        by_namespace.setdefault(pod["metadata"]["namespace"], []).append(pod)
    for svc in headless:
        name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
        base = f"{name}.{ns}"
        for pod in services.endpoints(svc, by_namespace.get(ns, [])):
            ip = pod["status"]["podIP"]
            found.append(Record(ns, ip, (base, f"{base}.svc", f"{base}.svc.{CLUSTER_DOMAIN}"),
                                (name,)))
            spec = pod.get("spec") or {}
            if spec.get("hostname") and spec.get("subdomain") == name:
                host = f"{spec['hostname']}.{name}"
                found.append(Record(ns, ip, (f"{host}.{ns}", f"{host}.{ns}.svc",
                                             f"{host}.{ns}.svc.{CLUSTER_DOMAIN}"), (host,)))
    return sorted(found, key=lambda r: (r.everywhere, r.ip))


def _lines(ip: str, names: list[str]) -> list[str]:
    return [f"{ip}\t{' '.join(names)}", f"::ffff:{ip}\t{' '.join(names)}"]


def render(pod: dict[str, Any], ip: str, zone: list[Record]) -> str:
    """The hosts file of one pod: the kubelet's part, then cluster DNS as seen from its
    namespace."""
    ns, host = pod["metadata"]["namespace"], hostname(pod)
    subdomain = (pod.get("spec") or {}).get("subdomain")
    # No comment lines: nss_wrapper's parser takes them for malformed entries.
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    if ip:
        own = [f"{host}.{subdomain}.{ns}.svc.{CLUSTER_DOMAIN}", host] if subdomain else [host]
        lines += _lines(ip, own)
    for record in zone:
        names = [*(record.local if record.namespace == ns else ()), *record.everywhere]
        lines += _lines(record.ip, names)
    return "\n".join(lines) + "\n"


def hosts_path(root: Path, pod: dict[str, Any]) -> Path:
    meta = pod["metadata"]
    return root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / "hosts"


class ClusterDns:
    """Writes and refreshes every running pod's hosts file."""

    def __init__(self, store: Store, root: Path) -> None:
        self.store, self.root = store, root
        self.library = network.nss_wrapper()
        self._written: dict[str, tuple[Path, str]] = {}  # pod uid -> (file, content)

    def env(self, pod: dict[str, Any], path: Path) -> dict[str, str]:
        """What a container needs to resolve through its pod's hosts file."""
        if self.library is None:
            return {}
        return {"LD_PRELOAD": self.library, "NSS_WRAPPER_HOSTS": str(path),
                "NSS_WRAPPER_HOSTNAME": hostname(pod)}

    def write(self, pod: dict[str, Any], ip: str) -> Path:
        """(Re)write one pod's file before one of its containers starts."""
        path = hosts_path(self.root, pod)
        self._put(pod["metadata"]["uid"], path, render(pod, ip, records(self.store)))
        return path

    def refresh(self) -> None:
        """Bring every written file up to date with the current records."""
        if not self._written:
            return
        zone = records(self.store)
        live = set()
        for pod in self.store.view("pods"):
            uid = pod["metadata"]["uid"]
            status = pod.get("status") or {}
            if uid in self._written and status.get("phase") not in ("Succeeded", "Failed"):
                live.add(uid)
                self._put(uid, self._written[uid][0], render(pod, status.get("podIP", ""), zone))
        for uid in set(self._written) - live:
            del self._written[uid]  # the pod ended or went: its processes are gone

    def _put(self, uid: str, path: Path, content: str) -> None:
        if self._written.get(uid) == (path, content) or not path.parent.is_dir():
            return
        fd, tmp = tempfile.mkstemp(prefix=".hosts.", dir=path.parent)
        with os.fdopen(fd, "w") as out:
            out.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # nss_wrapper rereads a file whose inode changed
        self._written[uid] = (path, content)

    async def run(self) -> None:
        queue = self.store.subscribe()
        try:
            while True:
                _, resource, _ = await queue.get()
                if resource not in ("pods", "services"):
                    continue
                await asyncio.sleep(_DEBOUNCE_SECONDS)
                while not queue.empty():
                    queue.get_nowait()
                with contextlib.suppress(OSError):  # a pod folder removed meanwhile
                    self.refresh()
        finally:
            self.store.unsubscribe(queue)
