"""A fresh copy of this checkout for tests that run documented commands as a user would.

The copy holds the files git knows of (tracked, and new ones not ignored) as they are in the working
tree, and `.venv` linked to this checkout's (so `./dev` installs nothing): runs, evidence and kubesim
state land in the copy, never in the developer's checkout. Blocks run with a Prefect home of their
own and no PREFECT_API_URL or KUBECONFIG of the caller's, as in a new shell.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from kubesim import devcluster

ROOT = Path(__file__).resolve().parents[2]
STAMP = ".trainguard-installed"


def copy_checkout(dest: Path) -> Path:
    """Copy the checkout's files into dest/checkout; its path."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    target = dest / "checkout"
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name)
    _share_venv(target)
    return target


def _share_venv(target: Path) -> None:
    """target/.venv: this checkout's venv entry by entry, with an install stamp of its own that
    says "installed" in the form the copy's `./dev` reads, so that it never reinstalls (which would
    point the shared venv's editable install at the copy)."""
    venv = target / ".venv"
    venv.mkdir()
    for entry in (ROOT / ".venv").iterdir():
        if entry.name != STAMP:
            (venv / entry.name).symlink_to(entry)
    digest = hashlib.sha256((target / "pyproject.toml").read_bytes()).hexdigest()
    # The stamp holds the pyproject digest, and (in the form that knows install sets) the set.
    sets = "have_set" in (target / "dev").read_text()
    (venv / STAMP).write_text(f"{digest} test\n" if sets else f"{digest}\n")


def user_env(home: Path) -> dict[str, str]:
    """The environment of a new shell: the caller's, without its Prefect server or cluster."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "PYTEST_", "KUBECONFIG", "TRAINGUARD_"))}
    home.mkdir(parents=True, exist_ok=True)
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return env


def stop_kubesim(checkout: Path, env: dict[str, str]) -> None:
    """`./dev kubesim stop` in the copy, then the copy's cluster folder removed: `./dev kubesim` keeps
    it for a resume, but the copy, and so its cluster, is the test's."""
    subprocess.run(["./dev", "kubesim", "stop"], cwd=checkout, env=env, capture_output=True, timeout=60)
    shutil.rmtree(devcluster.folder(checkout), ignore_errors=True)
