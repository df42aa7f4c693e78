"""The adapters the default blocks build, from plain values and without Prefect.

`EvidenceFolder.store()` and `LocalProcessBackend.backend()` build through these, and so does the
command line where it reads a folder or a work root given on it: `trainguard evidence show` must
answer in a fraction of a second, and importing Prefect's block machinery costs about two. Nothing
else names a concrete store or backend class outside the blocks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trainguard.core.backends.base import Backend
from trainguard.core.home import data_path
from trainguard.core.backends.forensics import StackCapture
from trainguard.core.backends.jobfiles import Budget
from trainguard.core.backends.local.backend import LocalBackend
from trainguard.core.backends.workspace_evidence import VERIFY_SECONDS
from trainguard.core.stores.base import EvidenceStore
from trainguard.core.stores.folder import LocalEvidenceStore


def evidence_folder(root: str | Path) -> EvidenceStore:
    """The evidence store of a folder (``trainguard-data/...`` lies under the data root, see `home`)."""
    return LocalEvidenceStore(data_path(root))


def local_backend(work_root: str | Path, grace_seconds: float = 10.0, python: str | None = None,
                  budget: Budget | None = None, capture: StackCapture | None = None,
                  checkpoint_verify_seconds: float = VERIFY_SECONDS) -> Backend:
    """The local-process backend over ``work_root``."""
    backend: Backend = LocalBackend(work_root=data_path(work_root),
                                    grace_seconds=grace_seconds, python=python or sys.executable,
                                    budget=budget or Budget(), capture=capture or StackCapture(),
                                    checkpoint_verify_seconds=checkpoint_verify_seconds)
    return backend
