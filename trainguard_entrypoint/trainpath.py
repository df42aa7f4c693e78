"""Putting the training-side helper (`trainguard_train`) on the command's Python path, on every backend.

The helper travels with the entrypoint: in the zipapp a pod or a Slurm node runs, both packages
are in the archive, and the archive itself goes on the command's ``PYTHONPATH``; from a source tree
(the local backend), the two packages are zipped into the attempt's folder, since putting the tree
itself on the path would show the command all of trainguard. Either way it goes last, so a helper
the training image installed itself wins.

Installed alone (an image that runs without the entrypoint): ``python -m trainguard_entrypoint.trainpath
DIR`` writes ``trainguard_train-<version>-py3-none-any.whl`` with the two stdlib packages into DIR,
for ``pip install`` (torch is the image's own).
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from collections.abc import Mapping, Sequence
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


WHEEL_NAME, WHEEL_VERSION = "trainguard_train", "0.1.0"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(folder: Path) -> Path:
    """A pure-Python wheel of the helper and the formats it writes, in ``folder``; its path."""
    root = _source_root()
    if root.is_file():
        raise RuntimeError("build the wheel from a source tree of trainguard, not from the zipapp")
    info = f"{WHEEL_NAME}-{WHEEL_VERSION}.dist-info"
    files = [(f"{package}/{path.name}", path.read_bytes()) for package in PACKAGES
             for path in sorted((root / package).glob("*.py"))]
    files.append((f"{info}/METADATA", (
        f"Metadata-Version: 2.1\nName: {WHEEL_NAME}\nVersion: {WHEEL_VERSION}\n"
        "Summary: trainguard's training-side helper: checkpoints on notice and from survivors (needs torch)\n"
        "Requires-Python: >=3.11\n").encode()))
    files.append((f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: trainguard\nRoot-Is-Purelib: true\n"
                                   b"Tag: py3-none-any\n"))
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files) + f"{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode()))
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{WHEEL_NAME}-{WHEEL_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, data in files:
            bundle.writestr(zipfile.ZipInfo(name, _EPOCH), data)
    return wheel


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m trainguard_entrypoint.trainpath DIR  (writes the helper's wheel into DIR)",
              file=sys.stderr)
        return 2
    print(build_wheel(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
