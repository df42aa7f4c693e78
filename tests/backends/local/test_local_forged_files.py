"""A local attempt whose job forges its stacks index, error file and progress record: still judged a code error.

A real entrypoint runs the job (tests/forged.py) through the local backend; the attempt is
judged as the attempt flow judges it (`judging.judge`), and its progress read as the report reads it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from forged import check_amplified, forger
from hostile import within

from trainguard.core import judging
from trainguard.core.backends.base import Launch
from trainguard.core.backends.local.backend import LocalBackend
from trainguard.core import progress


@pytest.mark.parametrize("mode", ["amplify", "nested"])
def test_a_forging_job_is_judged_a_code_error_its_stacks_read_once(mode: str, tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "work", grace_seconds=2.0)
    ref = backend.provision(f"forged-{mode}", 1)
    launch = Launch(ref.run_id, 1, (sys.executable, *forger(mode)), deadline_seconds=120, stall_seconds=60)

    outcome = within(150, lambda: backend.run(ref, launch, on_line=lambda line: None), "the attempt to end")

    assert (outcome.reason, outcome.exit_code) == ("Error", 1), outcome.message
    judged = within(60, lambda: judging.judge(backend, ref, outcome), "the judgement")
    assert judged.diagnosis is not None and judged.diagnosis.category == "code_error", judged.diagnosis
    log = backend.log(ref, outcome)
    assert isinstance(log, Path) and [step for step, _ in progress.read_points(log)] == list(range(8))
    if mode == "amplify":
        check_amplified(backend.signals(ref, outcome).stacks)
