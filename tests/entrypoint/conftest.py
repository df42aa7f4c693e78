"""Fixtures for the entrypoint tests: a fresh cwd and attempt folder per test."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from entrypoint_harness import EntrypointRun, entrypoint_argv, entrypoint_env


@pytest.fixture
def run_entrypoint(tmp_path: Path):
    """Run the entrypoint to completion in ``tmp_path/cwd`` (where relative core files land)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    workspace = tmp_path / "ws"

    def run(command: Sequence[str], *options: str, env: Mapping[str, str] | None = None,
            path: str | None = None, timeout: float = 60) -> EntrypointRun:
        proc = subprocess.run(entrypoint_argv(workspace, command, *options), cwd=cwd,
                              env=entrypoint_env(env, path=path), capture_output=True, timeout=timeout)
        return EntrypointRun(proc.returncode, proc.stdout, proc.stderr.decode(errors="replace"), workspace)

    return run
