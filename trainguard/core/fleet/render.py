"""The fleet view as JSON (for machines) and as Markdown (the ``trainguard-fleet`` artifact).

Every string from a verdict (node names, rules, fingerprints, log lines) is untrusted: the JSON form
masks it, and the Markdown form also escapes Markdown and HTML and flattens it to one line
(``reports.run.md_text``), so a node named ``[x](javascript:...)`` or a line with ``|`` and
``<script>`` shows as text. The terminal tables are the CLI's, which hands the same strings to rich
as `Text`.
"""

from __future__ import annotations

from typing import Any

from trainguard.core import masking
from trainguard.core.fleet.analysis import FleetView, NodeRow, Suspect
from trainguard.core.reports.run import md_text

ROWS = 50  # rows of each Markdown table; the JSON form has them all


def to_json(view: FleetView, window: dict[str, Any]) -> dict[str, Any]:
    """The whole view as plain data, every string masked."""
    rule = view.rule
    data = {
        "window": window,
        "totals": {"attempts": view.attempts, "failures": view.failures, "hardware_failures": view.hardware_failures,
                   "gpu_hours_wasted": round(view.gpu_hours_wasted, 2)},
        "nodes": [{"node": r.node, "attempts": r.attempts, "failures": dict(r.failures),
                   "failure_rate": round(r.failure_rate, 4), "hardware_failures": r.hardware_failures,
                   "hardware_failure_rate": round(r.hardware_rate, 4), "gpu_hours_wasted": round(r.gpu_hours_wasted, 2),
                   "last_failure": r.last_failure} for r in view.nodes],
        "fingerprints": [{"fingerprint": r.fingerprint, "category": r.category, "rule": r.rule,
                          "first_seen": r.first_seen, "last_seen": r.last_seen, "runs": r.runs,
                          "attempts": r.attempts, "nodes": list(r.nodes), "example": r.example}
                         for r in view.fingerprints],
        "suspects": [suspect_json(s) for s in view.suspects],
        "rule": {"min_failures": rule.min_failures, "min_ratio": rule.min_ratio, "alpha": rule.alpha},
    }
    masked: dict[str, Any] = masking.mask_tree(data)
    return masked


def suspect_json(suspect: Suspect) -> dict[str, Any]:
    """One suspect with the evidence behind it (the payload of its event, too)."""
    test = suspect.test
    return {"node": suspect.node, "attempts": test.attempts, "hardware_failures": test.failures,
            "by_category": dict(suspect.by_category), "rate": round(test.rate, 4),
            "fleet_rate": round(test.fleet_rate, 4), "ratio": round(test.rate / test.fleet_rate, 2),
            "p_value": test.p_value, "threshold": test.threshold,
            "examples": [dict(e) for e in suspect.examples]}


def to_json_suspect(suspect: Suspect) -> dict[str, Any]:
    """One suspect with its evidence, every string masked (an event's payload)."""
    masked: dict[str, Any] = masking.mask_tree(suspect_json(suspect))
    return masked


def evidence_line(suspect: Suspect) -> str:
    """One line a person reads: the counts, the rates and the test."""
    test = suspect.test
    kinds = ", ".join(f"{n} {c}" for c, n in sorted(suspect.by_category.items()))
    return (f"{test.failures} hardware failures in {test.attempts} attempts ({kinds}): {test.rate:.1%} vs the "
            f"rest of the fleet's {test.fleet_rate:.1%} ({test.rate / test.fleet_rate:.1f}x), "
            f"p = {test.p_value:.2g} <= {test.threshold:.2g}")


def markdown(view: FleetView, title: str) -> str:
    """The Markdown report: totals, suggested actions, nodes, recurring fingerprints."""
    lines = [f"# {md_text(title)}", "",
             f"{view.attempts} attempts, {view.failures} failed ({view.hardware_failures} on hardware), "
             f"{view.gpu_hours_wasted:,.1f} GPU-hours of failed attempts that no checkpoint kept.", "",
             "## Suggested actions", ""]
    if not view.suspects:
        lines.append("No node fails on hardware well above the fleet (rule: at least "
                     f"{view.rule.min_failures} failures, {view.rule.min_ratio:g}x the fleet's rate, one-sided "
                     f"binomial p <= {view.rule.alpha:g} / nodes).")
    for suspect in view.suspects:
        lines.append(f"- avoid **{md_text(suspect.node, 120)}**: {md_text(evidence_line(suspect), 400)}")
        lines += [f"  - {md_text(e['ended_at'])} {md_text(e['run'])} attempt {md_text(e['attempt'])}: "
                  f"{md_text(e['category'])} `{md_text(e['fingerprint'], 40)}` {md_text(e['signature'], 160)}"
                  for e in suspect.examples]
    lines += ["", "## Nodes", "", "The hardware failure rate speaks of the node; code, config and data failures "
              "are the runs' own and say nothing about it.", "",
              f"| node | attempts | {' | '.join(NODE_COLUMNS)} | GPU-hours wasted | last failure |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {md_text(r.node, 120)} | {r.attempts} | {' | '.join(md_text(c) for c in node_cells(r))} | "
              f"{r.gpu_hours_wasted:,.1f} | {md_text(r.last_failure or '-')} |" for r in view.nodes[:ROWS]]
    lines += _more(len(view.nodes))
    lines += ["", "## The same failure across runs", "",
              "| fingerprint | category | rule | first seen | last seen | runs | nodes | example |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {md_text(r.fingerprint, 40)} | {md_text(r.category)} | {md_text(r.rule)} | {md_text(r.first_seen)} | "
              f"{md_text(r.last_seen)} | {r.runs} | {md_text(', '.join(r.nodes), 160)} | {md_text(r.example, 160)} |"
              for r in view.fingerprints[:ROWS]]
    lines += _more(len(view.fingerprints))
    return "\n".join(lines) + "\n"


NODE_COLUMNS = ("hardware failures", "hardware failure rate", "other failures (not the node's)")


def node_cells(row: NodeRow) -> tuple[str, str, str]:
    """A node's hardware failures, their rate, and the failures that say nothing about the node."""
    hardware = {c: n for c, n in row.failures.items() if c not in row.other_failures}
    return (_failures(hardware), f"{row.hardware_rate:.1%}", _failures(row.other_failures))


def _failures(by_category: dict[str, int] | Any) -> str:
    return ", ".join(f"{n} {c}" for c, n in by_category.items()) or "-"


def _more(total: int) -> list[str]:
    return ["", f"{total - ROWS} more rows in `trainguard fleet --json`."] if total > ROWS else []
