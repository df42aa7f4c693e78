"""The recovery benchmark's own code, run once on the local backend so it cannot rot unseen.

One real fault (rank 1 of a 2-rank DDP run on gloo gets SIGKILL) goes through `benchmarks/recovery.py`
exactly as the benchmark runs it: trainguard's `training_run` with a real Prefect server, the
moments read back from that server and the training script's timeline. What is checked is the
shape of the answer (every moment present, in order, the phases adding up to the total, the steps
lost from the checkpoints the run really has), never how long anything took: the figures belong to
the benchmark. Both ways the script checkpoints: through `trainguard_train` (a survivor saves the
last completed step, so at most one step is lost) and the periodic-only baseline.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from benchmarks import recovery

SETTINGS = recovery.Settings(steps=12, fault_step=6, checkpoint_every=4, step_seconds=0.1, backoff=0.0,
                             stall_seconds=60.0, timeout=240.0)


@pytest.mark.parametrize("periodic_only", [False, True], ids=["helper", "periodic-only"])
def test_a_killed_rank_is_timed_from_the_fault_to_the_next_attempts_first_step(prefect_server, tmp_path: Path,
                                                                               periodic_only: bool) -> None:
    m = recovery.measure_local("sigkill", tmp_path, dataclasses.replace(SETTINGS, periodic_only=periodic_only))
    assert m.problem is None, m.problem
    names = [what for what, _ in m.moments]
    assert names[0] == "fault" and names[-1] == "first step done"
    for needed in ("the backend saw", "evidence kept", "verdict judged", "attempt 2's flow run created",
                   "attempt 2's workspace", "torchrun agent started", "init_process_group", "checkpoint loaded"):
        assert any(name.startswith(needed) for name in names), (needed, names)
    recovery.check_order(m.moments)
    assert list(m.phases) == list(recovery.PHASES)
    assert sum(m.phases.values()) == pytest.approx(m.total, abs=1e-6)
    assert all(seconds >= -0.02 for seconds in m.phases.values()), m.phases
    # the run's own checkpoints say which step the next attempt had to resume from
    kept = sorted(int(p.stem.split("-")[1]) for p in (tmp_path / "work").rglob("step-*.pt"))
    assert m.failed_at_step is not None and m.failed_at_step >= SETTINGS.fault_step
    assert m.resumed_at_step == max(s for s in kept if s <= m.failed_at_step)
    assert m.steps_lost == m.failed_at_step - m.resumed_at_step
    acked = {p.name.removesuffix(".json") for p in (tmp_path / "work").rglob(".trainguard-acks/step-*.pt.json")}
    if periodic_only:  # the script's own saves, on the checkpoint cadence only, never acknowledged
        assert all(s % SETTINGS.checkpoint_every == 0 for s in kept) and not acked, (kept, acked)
    else:  # the survivor saved the last step completed before the fault
        assert m.steps_lost <= 1, (m.failed_at_step, m.resumed_at_step, kept)
        assert f"step-{m.resumed_at_step:06d}.pt" in acked, (m.resumed_at_step, acked)
    assert m.own_share is not None and 0 < m.own_share < m.total
    row = recovery.table([m]).splitlines()[2]
    system = recovery.PERIODIC if periodic_only else "trainguard"
    assert row.startswith(f"| {system} | local | sigkill | 1/1 |") and row.endswith(f"| {m.steps_lost} |")


def test_moments_out_of_order_are_refused_not_turned_into_negative_phases() -> None:
    moments = [("fault", 10.0), ("the backend saw the command end", 12.0), ("evidence kept", 11.5)]
    with pytest.raises(ValueError, match="'evidence kept' at 11.500 before 'the backend saw the command end'"):
        recovery.check_order(moments)
    recovery.check_order(moments[:2])
    assert recovery.phases_of(moments[:2])["detection"] == pytest.approx(2.0)


def test_importing_a_benchmark_leaves_the_environment_of_the_importer_alone() -> None:
    """The benchmarks quiet Prefect when run as scripts; a test suite importing one (this file) must
    not have every later subprocess of its worker lose its INFO logs."""
    import os
    import subprocess
    import sys

    code = ("import os, sys; before = dict(os.environ)\n"
            "import benchmarks.recovery, benchmarks.attempt_overhead, benchmarks.throughput_runs, "
            "benchmarks.supervision_load\n"
            "changed = sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k))\n"
            "sys.exit(f'changed: {changed}' if changed else 0)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_LOGGING", "PREFECT_SERVER_ANALYTICS"))}
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
