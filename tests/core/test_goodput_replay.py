"""The effective-training-time replay (benchmarks/goodput.py) on a small size: its books balance
and the orderings that hold by construction hold. No figure of the benchmark's goals is asserted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_goodput() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("goodput", BENCHMARKS / "goodput.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["goodput"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


goodput = load_goodput()


@pytest.fixture(scope="module", params=["llama3", "opt-h200"])
def rows(request: pytest.FixtureRequest) -> dict[str, dict[str, object]]:
    params = goodput.Params(judgement=0.01)
    return goodput.run_policies(goodput.TRACES[request.param], 4096, 12, 72.0, None, params, 7)


def test_every_policys_breakdown_adds_up_to_the_whole_elapsed_time(rows):
    assert set(rows) == {p.name for p in goodput.POLICIES}
    for name, row in rows.items():
        parts = row["breakdown_percent"]
        assert sum(parts.values()) == pytest.approx(100.0), name
        assert all(value >= -1e-9 for value in parts.values()), (name, parts)
        assert parts["training_that_counts"] == pytest.approx(100 * row["effective_training_time"])


def test_the_orderings_that_hold_by_construction(rows):
    no_retry, retry_all = rows["no retry"], rows[goodput.BASELINE]
    # Only a retry can start an attempt that a cause that stays dooms; a person removes the cause.
    assert no_retry["breakdown_percent"]["could_not_succeed"] == 0
    # No retry hands over at every failure: each hand-over is one failed attempt, the rest finish.
    assert no_retry["attempts"] == no_retry["hand_overs_to_a_person"] + 12
    # The baseline's ratio to itself, and every waste measured against it in the same run.
    assert retry_all["waste_below_retry_all"] == 0
    for row in rows.values():
        assert row["gpu_hours_wasted"] >= 0
        assert row["hand_overs_to_a_person"] >= 12 - row["runs_finished_without_a_person"]


def test_a_failure_free_run_is_all_training_and_restarts_nothing():
    params = goodput.Params(judgement=0.0)
    trace = goodput.Trace("none", "no failures", 1e-12, goodput.LLAMA3.mix, {}, 1)
    rows = goodput.run_policies(trace, 1024, 3, 10.0, 100.0, params, 1)  # no checkpoint within the run
    for row in rows.values():
        assert row["effective_training_time"] == pytest.approx(1.0)
        assert row["attempts"] == 3 and row["runs_finished_without_a_person"] == 3


def test_the_replays_cached_classifier_judges_as_the_flows_classify_does():
    """The replay scans an excerpt once and concludes per attempt; the result is triage.classify's."""
    from trainguard.core import triage

    replay = sys.modules["gpu_hours_wasted"]
    excerpts = replay.load_excerpts()
    sample = [(category, rows[i]) for category, rows in sorted(excerpts.items()) for i in (0, len(rows) - 1)]
    for category, row in sample:
        failure = replay.Failure(1.0, category, row)
        ours = replay.diagnose(failure, [])
        events = row.get("events")
        theirs = triage.classify(triage.Signals(
            exit_code=replay.exit_code(failure), reason=row.get("reason") or None,
            events=tuple(events) if isinstance(events, list) else (), log=row.get("log"),
            error_files=replay.error_files(row)))
        assert theirs is not None
        assert (ours.category, ours.retryable, ours.fingerprint) == (theirs.category, theirs.retryable,
                                                                      theirs.fingerprint), row.get("url")
