"""Fixtures shared by more than one test folder: one real Prefect server for the whole session.

Flow tests of every backend (tests/flows, tests/backends/slurm) run real flows against the same server,
which takes ~10 s to start on 2 cores; each folder's conftest adds its own blocks and services.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL
from prefect.testing.utilities import prefect_test_harness

from _pytest.nodeid import coerce_node_id  # pytest 9's node ids

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Each test keeps its runs in trainguard-data/ of its own folder; a data root set by ./dev or the user
# would gather every test's runs in one place.
os.environ.pop("TRAINGUARD_HOME", None)
_ROOT = Path(__file__).resolve().parent.parent


_PR_GET_CHILD_SUBREAPER = 37
_libc = ctypes.CDLL(None, use_errno=True)


def _subreaper() -> bool:
    flag = ctypes.c_int(0)
    return _libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value != 0


@pytest.fixture(autouse=True)
def _the_worker_stays_an_ordinary_parent():
    """No test may make its pytest process a subreaper (the entrypoint does, run in-process): that
    process would then reap the session's other children (Popen reads a stolen status as exit 0) and
    the entrypoint would end them all as its descendants, the session's Prefect server among them."""
    yield
    assert not _subreaper(), "this test made the pytest process a child subreaper: run the entrypoint as its own process"


@pytest.fixture(scope="session")
def prefect_server():
    """A real Prefect API server for the session; yields its URL for subprocesses."""
    with prefect_test_harness(server_startup_timeout=240):
        yield PREFECT_API_URL.value()


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 2 MB tmpfs, mounted for the test (we run as root in CI); skips, saying why, where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 2 MB tmpfs here (needs root and mount rights): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# The suite runs on several pytest-xdist workers (`./dev test` passes `-n`, `--dist loadgroup`).
# A folder whose tests share an expensive service for the session (the Slurm cluster; the
# PostgreSQL-backed Prefect server) is a group that runs on one worker, so the service starts once;
# every other test is handed out on its own, to whichever worker is free. The longest groups go
# first, so that no long group is left to run alone at the end.
_ONE_WORKER_FOLDERS = ("tests/scale/", "tests/backends/slurm/")
# Files outside those folders that use one of their services, and the folder's group they join;
# and the README's blocks, which run in page order in one copy of the checkout, a later block using
# what an earlier one left.
_README = "tests/docs/test_readme.py"
_JOINS = {"tests/backends/test_backend_contract.py": "tests/backends/slurm", _README: _README}
_LONGEST_FIRST = ("tests/scale", "tests/backends/slurm", _README, "tests/flows", "tests/stores", "tests/cluster",
                  "tests/backends/kubernetes")


def _group(item: pytest.Item) -> str | None:
    """The one-worker group of `item`, or None for a test that may run on any worker."""
    path = item.path.relative_to(_ROOT).as_posix()
    if path in _JOINS:
        return _JOINS[path]
    folder = next((f for f in _ONE_WORKER_FOLDERS if path.startswith(f)), None)
    return folder.rstrip("/") if folder else None


def _rank(item: pytest.Item) -> int:
    path = item.path.relative_to(_ROOT).as_posix()
    for rank, prefix in enumerate(_LONGEST_FIRST):
        if (_group(item) or path).startswith(prefix):
            return rank
    return len(_LONGEST_FIRST)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups off the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)
    for item in items:
        group = _group(item)
        if group is None:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, "loadgroup", False) and "@" not in item.nodeid:
            # xdist 3.8 makes a group hold by appending `@group` to the node id, through `_nodeid`,
            # which pytest 9 no longer reads (its id is `_id`): without this, the group's tests were
            # spread over every worker, and each started its own Slurm cluster or PostgreSQL server.
            item._id = coerce_node_id(f"{item.nodeid}@{group}")
