"""The container entrypoint's archive (`entrypoint_archive`) in a ConfigMap.

A user's training image needs only a Python 3: the Job mounts this ConfigMap and runs
`python trainguard-entrypoint.pyz -- <command>`. The ConfigMap is named after the archive's digest,
so a running Job keeps the version it started with and equal builds share one ConfigMap.
"""

from __future__ import annotations

import base64
from typing import Any

from trainguard.core.backends import entrypoint_archive

ENTRYPOINT_FILE = "trainguard-entrypoint.pyz"
CONFIG_MAP_PREFIX = "trainguard-entrypoint-"


def config_map_name() -> str:
    """`trainguard-entrypoint-<first 12 hex digits of the archive's sha256>`."""
    return CONFIG_MAP_PREFIX + entrypoint_archive.digest()[:12]


def config_map(namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The ConfigMap carrying the zipapp as binaryData."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_map_name(), "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "trainguard", "app.kubernetes.io/component": "entrypoint",
                                **(labels or {})}},
        "binaryData": {ENTRYPOINT_FILE: base64.b64encode(entrypoint_archive.build()).decode("ascii")},
    }
