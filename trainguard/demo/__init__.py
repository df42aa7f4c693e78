"""The embedded demo: a tiny CPU training script and the spec that runs it through trainguard."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("train_tiny.py")


def demo_spec(steps: int = 60, fail_at_step: int = 35, delay_seconds: float = 2.0) -> dict[str, object]:
    """A run that checkpoints every 10 steps, dies of an NCCL watchdog timeout on attempt 1, then resumes.

    Its hub token is a stand-in planted in this process's environment, where a worker would hold the
    real one; the spec only names it, so the value never travels as a flow-run parameter.
    """
    os.environ.setdefault("DEMO_HUB_TOKEN", "hf_demo_secret_value")
    return {
        "name": "tiny-regression",
        "command": [
            sys.executable, str(SCRIPT), "--steps", str(steps), "--checkpoint-every", "10", "--step-seconds", "0.05",
            "--fail-at-step", str(fail_at_step), "--fail-on-attempt", "1", "--failure", "nccl-timeout",
        ],
        "env": {"WANDB_MODE": "offline"},
        "secret_env": {"DEMO_HUB_TOKEN": "env:DEMO_HUB_TOKEN"},
        "deadline_seconds": 300,
        "stall_seconds": 60,
        "retry": {"max_attempts": 3, "delay_seconds": delay_seconds},
    }
