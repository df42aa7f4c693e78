"""Putting the training-side helper (`trainguard_train`) on the command's Python path, on every backend.

The helper travels with the entrypoint: in the zipapp a pod or a Slurm node runs, both packages
are in the archive, and the archive itself goes on the command's ``PYTHONPATH``; from a source tree
(the local backend), the two packages are zipped into the attempt's folder, since putting the tree
itself on the path would show the command all of trainguard. Either way it goes last, so a helper
the training image installed itself wins.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path

import trainguard_entrypoint

PACKAGES = ("trainguard_entrypoint", "trainguard_train")
HELPER_ARCHIVE = Path("site") / "trainguard-train.zip"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _source_root() -> Path:
    return Path(trainguard_entrypoint.__file__).resolve().parent.parent


def helper_archive(workspace: Path) -> Path | None:
    """The zip or zipapp holding `trainguard_train` to put on the path; None when it is not around."""
    root = _source_root()
    if root.is_file():  # running from the zipapp: it carries the helper
        return root
    if not (root / "trainguard_train" / "__init__.py").is_file():
        return None
    archive = workspace / HELPER_ARCHIVE
    archive.parent.mkdir(parents=True, exist_ok=True)
    temporary = archive.with_name(f".{archive.name}.tmp")
    with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as bundle:
        for package in PACKAGES:
            for path in sorted((root / package).glob("*.py")):
                bundle.writestr(zipfile.ZipInfo(f"{package}/{path.name}", _EPOCH), path.read_bytes())
    temporary.replace(archive)
    return archive


def with_helper(env: Mapping[str, str], workspace: Path) -> dict[str, str]:
    """``env`` with the helper's archive last on ``PYTHONPATH`` (unchanged when there is none)."""
    result = dict(env)
    archive = helper_archive(workspace)
    if archive is not None:
        path = result.get("PYTHONPATH", "")
        result["PYTHONPATH"] = f"{path}:{archive}" if path else str(archive)
    return result
