"""The container entrypoint as one file: a zipapp built from `trainguard_entrypoint`, in a ConfigMap.

A user's training image needs only a Python 3: the Job mounts this ConfigMap and runs
`python trainguard-entrypoint.pyz -- <command>`. The archive is byte-for-byte reproducible (sorted
entries, fixed timestamps), and the ConfigMap is named after its digest, so a running Job keeps
the version it started with and equal builds share one ConfigMap.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainguard_entrypoint.trainpath import PACKAGES

ENTRYPOINT_FILE = "trainguard-entrypoint.pyz"
CONFIG_MAP_PREFIX = "trainguard-entrypoint-"
_MAIN = b"import sys\nfrom trainguard_entrypoint.__main__ import main\nsys.exit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _package_dir() -> Path:
    spec = importlib.util.find_spec("trainguard_entrypoint")
    if spec is None or spec.origin is None:
        raise RuntimeError("trainguard_entrypoint is not installed next to trainguard; reinstall trainguard")
    return Path(spec.origin).parent


@lru_cache(maxsize=1)
def build() -> bytes:
    """The zipapp's bytes: `__main__.py` plus every `.py` file of `trainguard_entrypoint` and `trainguard_train`."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo("__main__.py", _EPOCH), _MAIN)
        for package in PACKAGES:  # the entrypoint and the training-side helper it puts on the path
            for path in sorted((_package_dir().parent / package).glob("*.py")):
                info = zipfile.ZipInfo(f"{package}/{path.name}", _EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


def config_map_name() -> str:
    """`trainguard-entrypoint-<first 12 hex digits of the archive's sha256>`."""
    return CONFIG_MAP_PREFIX + hashlib.sha256(build()).hexdigest()[:12]


def config_map(namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The ConfigMap carrying the zipapp as binaryData."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_map_name(), "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "trainguard", "app.kubernetes.io/component": "entrypoint",
                                **(labels or {})}},
        "binaryData": {ENTRYPOINT_FILE: base64.b64encode(build()).decode("ascii")},
    }
