"""Running the real entrypoint as a child process, the way a container or the local runner does."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class EntrypointRun:
    """One finished entrypoint process and the attempt folder it wrote."""

    returncode: int
    stdout: bytes
    stderr: str
    workspace: Path

    @property
    def report(self) -> dict[str, Any]:
        return json.loads((self.workspace / "crash-report.json").read_text())

    @property
    def log(self) -> bytes:
        return (self.workspace / "logs" / "train-r1-attempt-1.log").read_bytes()

    def json(self, relative: str) -> Any:
        return json.loads((self.workspace / relative).read_text())


def entrypoint_env(extra: Mapping[str, str] | None = None, *, path: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    # no nvidia-smi on this machine's PATH unless a test plants one
    env["PATH"] = path if path is not None else os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    env.update(extra or {})
    return env


def entrypoint_argv(workspace: Path, command: Sequence[str], *options: str) -> list[str]:
    return [sys.executable, "-m", "trainguard_entrypoint", "--workspace", str(workspace),
            "--run-id", "r1", "--attempt", "1", *options, "--", *command]


def py(code: str) -> list[str]:
    """A command running ``code`` in a fresh Python."""
    return [sys.executable, "-c", code]
