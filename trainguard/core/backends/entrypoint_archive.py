"""The stdlib-only entrypoint as one file: a zipapp of `trainguard_entrypoint` and the training-side
helper it puts on the command's path (`trainguard_train`), for every backend whose training runs
where this checkout is not (a pod, a Slurm compute node).

The archive is byte-for-byte reproducible (sorted entries, fixed timestamps), so its digest names a
version: Kubernetes names the ConfigMap carrying it after the digest, Slurm the file on its shared
folder. How a backend ships the archive (a ConfigMap, a file) is the backend's; building it is here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import zipfile
from functools import lru_cache
from pathlib import Path

from trainguard_entrypoint.trainpath import PACKAGES

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


def digest() -> str:
    """The archive's SHA-256 in hex: equal builds share it."""
    return hashlib.sha256(build()).hexdigest()


def write_into(folder: Path) -> Path:
    """``{folder}/entrypoint-<first 16 hex digits of the digest>.pyz``, written once per version.

    The write is atomic (a temporary name, then a rename), so flows writing the same version at
    once all leave the same bytes and none runs a half-written archive.

    Raises:
        OSError: The folder cannot be made or written.
    """
    target = Path(folder) / f"entrypoint-{digest()[:16]}.pyz"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    data = build()
    partial = target.with_name(f".{target.name}.{id(data)}.tmp")
    partial.write_bytes(data)
    partial.replace(target)
    return target
