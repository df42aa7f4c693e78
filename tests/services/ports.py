"""Free loopback ports for services the tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rendezvous_port() -> int:
    """A port free on every address: c10d's store listens on all of them, and kubesim's pods share this host's."""
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::", 0))
        return int(probe.getsockname()[1])
