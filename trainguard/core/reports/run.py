"""The run report: the Markdown a person opens first, rendered from the attempts' summaries.

A timeline of attempts (state, category, duration, GPU-seconds wasted, the checkpoint each resumed
from) and a text chart of step progress and loss per attempt, in a fenced block so the Prefect UI
shows it as it is. Every value that came from a log, a spec or a path is untrusted: it is escaped
for Markdown and HTML, stripped of control characters and cut to a bounded length, so no log line
can break the tables or inject markup; declared secrets are masked first (`masking`, as the attempt
report does). Only numbers and trainguard's own words enter the chart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePath

from trainguard.core import masking
from trainguard.core.reports import attempt as attempt_report
from trainguard.core.attempt import AttemptSummary

_BARS = "▁▂▃▄▅▆▇█"
_WIDTH = 40
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+!|~<>&])")
_MARKUP = {"<": "&lt;", ">": "&gt;", "&": "&amp;", "|": "&#124;"}


def md_text(text: object, limit: int = 200) -> str:
    """`text` as inert Markdown inline text: one line, no markup, no HTML, at most `limit` characters."""
    flat = _CONTROL.sub(" ", masking.for_people(str(text)))[: limit + 1]
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return _MARKDOWN.sub(lambda m: _MARKUP.get(m.group(1), "\\" + m.group(1)), flat)


def _timeline(summaries: Sequence[AttemptSummary]) -> list[str]:
    rows = ["| attempt | flow run | state | category | duration | GPU-seconds (wasted) | resumed from | then |",
            "|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        resumed = md_text(PurePath(s.resumed_from).name, 80) if s.resumed_from else "(start)"
        then = _then(s)
        rows.append(
            f"| {attempt_report.attempt_cell(s)} | {md_text(s.flow_run_name or s.flow_run_id or '-', 80)} | "
            f"**{md_text(s.state, 20)}** | {md_text(s.category or '-', 40)} | {s.duration_seconds:.1f} s | "
            f"{s.gpu_seconds:.0f} ({s.wasted_gpu_seconds:.0f}) | {resumed} | {then} |"
        )
    return rows


def _then(summary: AttemptSummary) -> str:
    """The retry decision in words, the checkpoint named by its file (its folder is the run's, and long)."""
    if summary.decision is None:
        return "-"
    reason = summary.decision.reason or "-"
    if checkpoint := summary.decision.resume_from:
        name = PurePath(str(checkpoint)).name
        reason = reason.replace(f"the newest checkpoint {checkpoint}", name).replace(str(checkpoint), name)
    return md_text(reason, 160)


def _sparkline(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(_BARS[round((v - low) / span * (len(_BARS) - 1))] for v in values)


def _progress_bar(first: int, last: int, top: int) -> str:
    begin, end = (round(x / top * _WIDTH) for x in (first, last))
    return "·" * begin + "█" * max(1, end - begin) + "·" * max(0, _WIDTH - max(end, begin + 1))


def chart(summaries: Sequence[AttemptSummary]) -> str:
    """Step progress and loss per attempt as a fenced text chart; '' when no log reported steps."""
    with_steps = [s for s in summaries if s.progress]
    if not with_steps:
        return ""
    top = max(step for s in with_steps for step, _ in s.progress) or 1
    lines = [f"step 0 {'─' * (_WIDTH - 12)} step {top}"]
    for s in summaries:
        if not s.progress:
            lines.append(f"a{s.attempt:<3} (no step output)")
            continue
        first, last = s.progress[0][0], s.progress[-1][0]
        mark = "✓" if s.succeeded else "✗"
        lines.append(f"a{s.attempt:<3}{_progress_bar(first, last, top)} {mark} steps {first}→{last}")
        losses = [loss for _, loss in s.progress if loss is not None]  # lines that named a step only
        if losses:
            lines.append(f"     loss {_sparkline(losses)} {losses[0]:.4g}→{losses[-1]:.4g}")
    return "```text\n" + "\n".join(lines) + "\n```"


def effective_time(summaries: Sequence[AttemptSummary]) -> list[str]:
    """The run's effective training time so far, and where the rest of its attempts' wall time went.

    As far as the attempts' records show it: an attempt's wall time is shared out among the steps it
    made past the checkpoint it resumed from (its last completed step minus that checkpoint's), and
    the share of the steps it lost (redone by the next attempt) goes to its failure's category. An
    attempt that made no step spent its time not training; one that recorded no step is not known.
    Nothing (an empty list) when no attempt recorded its steps.
    """
    if all(s.progress_step is None for s in summaries):
        return []
    counted, kept, lost = 0.0, 0, 0
    rest: dict[str, float] = {}
    for s in summaries:
        cause = md_text(s.category or ("completed" if s.succeeded else "unknown"), 40)
        made_and_lost = s.steps
        if made_and_lost is None:
            rest[f"not known (attempt {s.attempt}, {cause}: no step record)"] = s.duration_seconds
        elif made_and_lost[0] <= 0:
            rest[f"not training (attempt {s.attempt}, {cause}: no step made)"] = s.duration_seconds
        else:
            made, gone = made_and_lost
            counted += s.duration_seconds * (made - gone) / made
            kept, lost = kept + made - gone, lost + gone
            if gone:
                rest[f"steps lost (attempt {s.attempt}, {cause}: {gone} steps redone)"] = s.duration_seconds * gone / made
    total = sum(s.duration_seconds for s in summaries) or 1.0
    lines = ["", "## Effective training time", "",
             f"{counted:.1f} s of {sum(s.duration_seconds for s in summaries):.1f} s of the attempts' wall time "
             f"({counted / total:.0%}) made the {kept} steps that count; {lost} steps were lost.", ""]
    if rest:
        lines += ["| where the rest went | seconds |", "|---|---|",
                  *(f"| {what} | {seconds:.1f} |" for what, seconds in rest.items())]
    return lines


def _storage(summaries: Sequence[AttemptSummary]) -> list[str]:
    """A warning block for every attempt that could not write everything (a full disk), before the timeline."""
    lines = [f"- attempt {s.attempt}: {md_text(problem, 300)}" for s in summaries for problem in s.storage_problems]
    return ["**Storage failed**: some of what trainguard writes could not be written, so the evidence is partial.",
            "", *lines, ""] if lines else []


def render_run(summaries: Sequence[AttemptSummary]) -> str:
    """The run report: headline, timeline of attempts and the progress chart."""
    last = summaries[-1]
    if last.succeeded:
        verdict = f"succeeded on attempt {last.attempt}"
    elif last.retried:
        verdict = f"attempt {last.attempt} failed ({md_text(last.category or 'unknown', 40)}); retrying"
    else:
        verdict = f"gave up after attempt {last.attempt} ({md_text(last.category or 'unknown', 40)})"
    total = sum(s.gpu_seconds for s in summaries)
    wasted = sum(s.wasted_gpu_seconds for s in summaries)
    lines = [f"# Run {md_text(last.run_id, 128)}: {verdict}", "",
             f"{len(summaries)} attempt(s), {total:.0f} GPU-seconds, {wasted:.0f} of them wasted.", "",
             *_storage(summaries), "## Timeline", "", *_timeline(summaries)]
    lines += effective_time(summaries)
    picture = chart(summaries)
    if picture:
        lines += ["", "## Progress per attempt", "", picture]
    if last.signature and not last.succeeded:
        lines += ["", f"**Last failure** ({md_text(last.rule_id or '-', 60)}): {md_text(last.signature, 300)}"]
    return "\n".join(lines)
