"""The fleet analysis over generated histories: the suspect rule, recurring fingerprints, per-node rows."""

from __future__ import annotations

from datetime import UTC, datetime

from histories import START, attempt, fleet

from trainguard.core.evidence import index
from trainguard.core.fleet import suspects
from trainguard.core.fleet.analysis import Tally


def records(history) -> list[dict]:
    return [index.entry(summary, when) for summary, when in history]


def test_a_planted_bad_node_among_fifty_is_the_one_suspect() -> None:
    view = Tally().add_all(records(fleet())).view()

    assert [s.node for s in view.suspects] == ["gpu-07"]
    test = view.suspects[0].test
    assert test.failures >= 10 and test.p_value <= test.threshold == 0.01 / 50
    assert sum(view.suspects[0].by_category.values()) == test.failures
    assert len(view.suspects[0].examples) == 3


def test_a_healthy_fleet_has_no_suspect() -> None:
    assert Tally().add_all(records(fleet(bad=None))).view().suspects == ()


def test_two_failures_in_three_attempts_is_not_enough() -> None:
    small = [(attempt(f"small-{k}", 1, "gpu-99", c), START) for k, c in enumerate(["gpu_fault", "nccl_error", None])]

    view = Tally().add_all(records([*fleet(bad=None), *small])).view()

    row = next(r for r in view.nodes if r.node == "gpu-99")
    assert (row.attempts, sum(row.failures.values())) == (3, 2)
    assert view.suspects == ()


def test_the_same_fingerprint_across_three_runs_on_three_nodes_is_one_row() -> None:
    same = [(attempt(f"run-{n}", 1, f"gpu-0{n}", "nccl_error", fingerprint="fp-watchdog",
                     signature=f"Watchdog caught collective operation timeout (run {n})"), START.replace(day=20 + n))
            for n in range(3)]

    view = Tally().add_all(records(same)).view()

    (row,) = view.fingerprints
    assert (row.fingerprint, row.runs, row.attempts, row.nodes) == ("fp-watchdog", 3, 3, ("gpu-00", "gpu-01", "gpu-02"))
    assert (row.first_seen, row.last_seen) == ("2026-11-20T00:00:00Z", "2026-11-22T00:00:00Z")
    assert row.example == "Watchdog caught collective operation timeout (run 2)"


def test_a_multi_node_failure_is_placed_on_the_culprits_node_only() -> None:
    multi = attempt("r1", 1, "gpu-02", "gpu_fault", root_cause={"index": 1, "node": "gpu-02"},
                    victims=({"index": 0, "node": "gpu-01", "rank": 0},))

    view = Tally().add_all(records([(multi, START)])).view()

    rows = {r.node: r for r in view.nodes}
    assert rows["gpu-02"].failures == {"gpu_fault": 1} and rows["gpu-01"].failures == {}
    assert rows["gpu-01"].attempts == rows["gpu-02"].attempts == 1


def test_gpu_hours_wasted_and_the_last_failure_per_node() -> None:
    history = [(attempt("r1", 1, "gpu-01", "cuda_oom"), START), (attempt("r2", 1, "gpu-01", "gpu_fault"),
               START.replace(day=21)), (attempt("r3", 1, "gpu-01", None), START.replace(day=22))]

    (row,) = Tally().add_all(records(history)).view().nodes

    assert row.gpu_hours_wasted == 2 * 8 * 1800 / 3600 and row.failure_rate == 2 / 3
    assert row.last_failure == "2026-11-21T00:00:00Z gpu_fault"


def test_a_failure_a_checkpoint_mostly_kept_wastes_only_the_steps_it_lost() -> None:
    # 100 steps made past step 200, 10 of them lost: a tenth of its 8 GPUs x 1800 s
    saved = attempt("r1", 2, "gpu-01", "gpu_fault", resumed_from_step=200, progress_step=300, steps_lost=10)
    unknown = attempt("r2", 1, "gpu-01", "gpu_fault")  # no step record: all of it, as before
    older = index.entry(attempt("r3", 1, "gpu-01", "gpu_fault", progress_step=50, steps_lost=0), START)
    del older["wasted_gpu_seconds"]  # a record written before the index kept the figure: its whole GPU-seconds

    (row,) = Tally().add_all([*records([(saved, START), (unknown, START)]), older]).view().nodes

    assert saved.wasted_gpu_seconds == 8 * 1800 / 10
    assert row.gpu_hours_wasted == (8 * 1800 / 10 + 2 * 8 * 1800) / 3600


def test_the_binomial_tail_matches_the_closed_form() -> None:
    assert abs(suspects.binomial_tail(2, 3, 0.5) - 0.5) < 1e-12
    assert abs(suspects.binomial_tail(1, 10, 0.1) - (1 - 0.9 ** 10)) < 1e-12
    assert suspects.binomial_tail(0, 5, 0.2) == 1.0 and suspects.binomial_tail(6, 5, 0.2) == 0.0
    assert suspects.binomial_tail(900, 1000, 0.01) < 1e-300  # far out in the tail: no overflow, no error


def test_a_nodes_hardware_failure_rate_is_apart_from_the_runs_own_code_and_config_failures() -> None:
    from trainguard.core.fleet import render

    history = [(attempt("r1", 1, "gpu-01", "code_error"), START), (attempt("r2", 1, "gpu-01", "config_error"), START),
               (attempt("r3", 1, "gpu-01", "gpu_fault"), START), (attempt("r4", 1, "gpu-01", None), START)]

    view = Tally().add_all(records(history)).view()
    (row,) = view.nodes

    assert (row.failure_rate, row.hardware_failures, row.hardware_rate) == (3 / 4, 1, 1 / 4)
    assert render.node_cells(row) == ("1 gpu_fault", "25.0%", "1 code_error, 1 config_error")
    node = render.to_json(view, {})["nodes"][0]
    assert (node["hardware_failures"], node["hardware_failure_rate"]) == (1, 0.25)
    markdown = render.markdown(view, "fleet")
    assert "| hardware failures | hardware failure rate | other failures (not the node's) |" in markdown
    assert "| 1 gpu\\_fault | 25.0% | 1 code\\_error, 1 config\\_error |" in markdown


def test_one_run_retried_on_the_same_node_again_and_again_does_not_make_it_a_suspect() -> None:
    """A run whose own bug prints an NCCL line wherever it lands, retried six times on gpu-77."""
    again = [(attempt("flaky-run", k, "gpu-77", "nccl_error"), START) for k in range(1, 7)]

    view = Tally().add_all(records([*fleet(bad=None), *again])).view()

    row = next(r for r in view.nodes if r.node == "gpu-77")
    assert (row.attempts, row.failures) == (6, {"nccl_error": 6})  # the table still shows every attempt
    assert view.suspects == ()


def test_three_runs_failing_on_one_node_in_few_attempts_make_it_a_suspect() -> None:
    three = [(attempt(f"run-{k}", 1, "gpu-77", "gpu_fault"), START) for k in range(3)]

    view = Tally().add_all(records([*fleet(bad=None), *three])).view()

    assert [s.node for s in view.suspects] == ["gpu-77"] and view.suspects[0].test.failures == 3
