"""A Slurm attempt whose job forges its stacks index, error file and progress record: still judged a code error.

One task under srun on the real test cluster runs the job (tests/forged.py); the supervisor reads their progress records while the job runs (a stall window is set),
and the attempt is judged as the attempt flow judges it (`judging.judge`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from forged import check_amplified, forger
from hostile import within

from trainguard.core import judging
from trainguard.core.backends.base import Launch
from trainguard.core.backends.slurm.backend import SlurmBackend
from trainguard.core.backends.slurm.client import SlurmClient
from trainguard.core.backends.slurm.job import JobSettings
from trainguard.core.stores.folder import LocalEvidenceStore


@pytest.mark.parametrize("mode", ["amplify", "nested"])
def test_a_forging_job_is_judged_a_code_error_its_stacks_read_once(mode: str, slurm_node_up, tmp_path: Path) -> None:
    backend = SlurmBackend(tmp_path / "shared", settings=JobSettings(),
                           client=SlurmClient(env=slurm_node_up.env), poll_max_seconds=0.5)
    ref = backend.provision(f"forged-slurm-{mode}", 1)
    launch = Launch(ref.run_id, 1, (sys.executable, *forger(mode)), deadline_seconds=300, stall_seconds=120)

    outcome = within(240, lambda: backend.run(ref, launch, on_line=lambda line: None), "the job to end")

    assert (outcome.reason, outcome.exit_code) == ("Error", 1), outcome.message
    within(120, lambda: backend.collect_evidence(ref, LocalEvidenceStore(tmp_path / "evidence"), outcome), "evidence")
    judged = within(60, lambda: judging.judge(backend, ref, outcome), "the judgement")
    assert judged.diagnosis is not None and judged.diagnosis.category == "code_error", judged.diagnosis
    if mode == "amplify":
        check_amplified(backend.signals(ref, outcome).stacks)
