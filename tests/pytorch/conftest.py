"""Real PyTorch runs for the session: each scenario runs once, and its evidence is shared.

The runs start with the session on background threads, the heaviest first, and each test waits
only for the runs it uses. A scenario's result is kept in a folder every pytest-xdist worker of
the session sees, under a file lock, so that no scenario runs twice; and a run holds one of
``SLOTS`` slot locks while it runs, so that however many workers there are, no more runs go at
once than the machine has cores for (every torchrun start imports torch in each process).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the real-PyTorch tests need torch (the test extra)")
from filelock import FileLock, Timeout  # noqa: E402 - installed with torch

from pytorch_runs import SCENARIOS, Run, run  # noqa: E402

_HEAVY_FIRST = ("two_nodes", "hang", "lightning")
SLOTS = max(1, min(2, os.cpu_count() or 1))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "scenarios(*names): the real runs a test reads (they start with the session)")


class Runs:
    """The session's real runs, by scenario name."""

    def __init__(self, folder: Path, python: str) -> None:
        self.folder = folder
        self.python = python
        self.stop = threading.Event()

    def get(self, name: str) -> Run:
        """The scenario's run: kept, being run elsewhere (then waited for), or run now."""
        done = self.folder / f"{name}.pickle"
        if not done.is_file():
            with FileLock(str(self.folder / f"{name}.lock")):
                if not done.is_file():
                    self._run(name, done)
        with done.open("rb") as fh:
            result: Run = pickle.load(fh)
        return result

    def prefetch(self, names: list[str]) -> None:
        """Run every named scenario nobody has taken yet, skipping those under way elsewhere."""
        pending = list(names)
        while pending and not self.stop.is_set():
            name = pending.pop(0)
            done = self.folder / f"{name}.pickle"
            if done.is_file():
                continue
            try:
                with FileLock(str(self.folder / f"{name}.lock"), timeout=0):
                    if not done.is_file():
                        self._run(name, done)
            except Timeout:
                pass  # another worker runs it; get() waits for it when a test needs it

    def _run(self, name: str, done: Path) -> None:
        with self._slot():
            result = run(SCENARIOS[name], self.folder / name, self.python)
        partial = done.with_suffix(".partial")
        with partial.open("wb") as fh:
            pickle.dump(result, fh)
        partial.replace(done)


    @contextmanager
    def _slot(self) -> Iterator[None]:
        while True:
            for number in range(SLOTS):
                lock = FileLock(str(self.folder / f"slot-{number}.lock"), timeout=0)
                try:
                    with lock:
                        yield
                        return
                except Timeout:
                    continue
            time.sleep(0.2)


def _needed(session: pytest.Session) -> list[str]:
    names: set[str] = set()
    for item in session.items:
        marker = item.get_closest_marker("scenarios")
        if marker is not None:
            names.update(marker.args)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("scenario") in SCENARIOS:
            names.add(callspec.params["scenario"])
    return sorted(names, key=lambda n: (not n.startswith(_HEAVY_FIRST), n))


@pytest.fixture(scope="session")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         worker_id: str) -> Iterator[Runs]:
    base = tmp_path_factory.getbasetemp()
    folder = (base if worker_id == "master" else base.parent) / "pytorch-runs"
    folder.mkdir(exist_ok=True)
    session = Runs(folder, sys.executable)
    threads = SLOTS if worker_id == "master" else 1
    with ThreadPoolExecutor(threads, thread_name_prefix="pytorch-run") as pool:
        names = _needed(request.session)
        for offset in range(threads):
            pool.submit(session.prefetch, names[offset:] + names[:offset])
        yield session
        session.stop.set()
