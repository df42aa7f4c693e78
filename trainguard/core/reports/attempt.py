"""Reports of attempts: the Markdown a person reads in the Prefect UI and the rows of the attempts table.

Rendering only: the flows publish these as artifacts, the CLI prints the same rows with rich.
Everything that came from a log, a spec or a rule file is untrusted: it is masked, stripped of
terminal sequences, and either escaped or put in a fenced code block whose fence is longer than
any backtick run inside, so no Markdown, HTML or link in it ever takes effect.
"""

from __future__ import annotations

import html
import shlex
import urllib.parse
import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

from trainguard.core import masking
from trainguard.core.attempt import STACKS_TABLE, AttemptSummary

_MARKDOWN_SPECIALS = re.compile(r"([\\`*_{}\[\]()#+!|~])")
_BACKTICKS = re.compile(r"`+")

TABLE_COLUMNS = (
    "attempt",
    "flow run",
    "state",
    "category",
    "rule",
    "rank",
    "signature",
    "duration",
    "resumed from",
    "evidence",
)


def table_row(summary: AttemptSummary) -> dict[str, str]:
    """One attempt as the cells of the attempts table (compact: the report has the full values)."""
    plain = masking.for_people
    return {
        "attempt": attempt_cell(summary),
        "flow run": plain(summary.flow_run_name or summary.flow_run_id or "-"),
        "state": summary.state,
        "category": (summary.category or "-") + (" (weak)" if summary.weak else ""),
        "rule": summary.rule_id or "-",
        "rank": rank_cell(summary),
        "signature": _shorten(words_first(plain(_signature(summary))), 90) or "-",
        "duration": f"{summary.duration_seconds:.1f}s",
        "resumed from": PurePath(summary.resumed_from).name if summary.resumed_from else "(start)",
        "evidence": _evidence_cell(summary),
    }


def rank_cell(summary: AttemptSummary) -> str:
    """The culprit's rank (with its pod's index on several nodes), "?" when only victims were found."""
    if summary.culprit_undetermined:
        return "?"
    root = summary.root_cause or {}
    rank = root.get("rank")
    if rank is None:
        return "-"
    index = root.get("index")
    return f"{rank} (node {index})" if isinstance(index, int) and index > 0 else str(rank)


def certainty(summary: AttemptSummary) -> str:
    """How sure the call is, for a person: a weak one says to check the deciding line by hand."""
    if not summary.category:
        return ""
    if summary.weak:
        how = f"decided by {summary.decided_by}" if summary.decided_by in ("rule order", "part order") \
            else f"only {summary.strength or 'weak'}-strength evidence"
        return f"weak call ({how}): check the deciding log line and the evidence by hand"
    if summary.culprit_undetermined:
        return "the category is sure; which rank started it is not (every rank only lost a peer)"
    if summary.decided_by == "stacks":
        return "judged from every rank's stack, taken while the ranks were alive: strong"
    return _JUDGED_FROM.get(summary.strength, "")


# The triage rules' strength names are the rule writers' words; a person reads what the call rests on.
_JUDGED_FROM = {
    "verdict": "judged from what the platform reported (termination reason, scheduler or eviction): sure",
    "cause": "judged from a root-cause line in the log: strong",
    "error": "judged from the error line in the log: strong",
    "crash": "judged from a native crash in the log, with no clearer cause beside it: fair",
    "consequence": "judged from what the ranks reported after the failure, not the failure itself: fair",
}


_PATHS = re.compile(r"(?<!\S)\[?[\w.+-]*(?:/[\w.+-]+)+\.(?:py|pyx|cc|cpp|cu|c|h|hpp)(?::\d+)?\]?[,:]?(?=\s|$)")


def words_first(text: str) -> str:
    """A log line without its source paths (`pair.cc:534]`, `/…/torch/…/x.py:12`), so a cut keeps what happened."""
    return " ".join(_PATHS.sub(" ", text).split()) or text


def storage_line(summary: AttemptSummary) -> str:
    """What could not be written for the attempt, in one line ("" when everything was)."""
    problems = summary.storage_problems
    if not problems:
        return ""
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{masking.for_people(problems[0])}{more}"


def _evidence_cell(summary: AttemptSummary) -> str:
    where = _relative(summary.evidence) if summary.evidence else "-"
    problem = storage_line(summary)
    return f"{where}\nSTORAGE FAILED: {_shorten(problem, 160)}" if problem else where


def _budget(summary: AttemptSummary) -> tuple[int | None, int | None, int | None]:
    """The run's budget as the decision counted it: (attempts without progress allowed, spent, in all)."""
    decision = summary.decision
    return (decision.budget, decision.without_progress, decision.total_budget) if decision else (None, None, None)


def attempt_cell(summary: AttemptSummary) -> str:
    """The attempt's number with what it spent of the budget once decided: ``7 (1/3 no progress)``.

    The budget counts attempts in a row without checkpoint progress (see `trainguard.core.policy`);
    a run with a bound in all shows it before: ``7/10 (1/3 no progress)``. A verdict written before
    attempts were counted this way shows its number over its budget, as it was decided.
    """
    budget, stalled, total = _budget(summary)
    number = f"{summary.attempt}/{total}" if total is not None else str(summary.attempt)
    if budget is not None and stalled is not None:
        return f"{number} ({stalled}/{budget} no progress)"
    return f"{summary.attempt}/{budget}" if budget is not None else number


def budget_note(summary: AttemptSummary) -> str:
    """What the attempt spent of the run's budget, in words ("" until it is decided)."""
    budget, stalled, total = _budget(summary)
    if budget is None:
        return ""
    if stalled is None:
        return f" (attempt {summary.attempt} of {budget})"
    in_all = f", {summary.attempt} of {total} in all" if total is not None else ""
    return f" ({stalled} of {budget} in a row without checkpoint progress{in_all})"


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _relative(location: str) -> str:
    """A local evidence path relative to the working directory when it lies below it."""
    try:
        return str(Path(location).relative_to(Path.cwd()))
    except ValueError:
        return location


def render_attempt(summary: AttemptSummary, earlier: Sequence[AttemptSummary] = ()) -> str:
    """The Markdown report of one attempt, ending with the table of all attempts so far."""
    verdict = "succeeded" if summary.succeeded else f"failed: {_text(summary.category or 'unknown')}"
    decision = summary.decision
    exit_code = summary.exit_code if summary.exit_code is not None else "-"
    lines = [
        f"# {_text(summary.run_id)}: attempt {summary.attempt} {verdict}{budget_note(summary)}",
        "",
        "| | |",
        "|---|---|",
        f"| category | {_cell(summary.category or '-')} |",
        f"| retryable | {'yes' if summary.retryable else 'no'} |",
        f"| rule | {_cell(summary.rule_id or '-')} |",
        *_culprit_rows(summary),
        f"| remediation | {_cell(summary.remediation or '-')} |",
        f"| exit code | {exit_code} ({_cell(summary.termination_reason or '-')}) |",
        f"| node | {_node(summary)} |",
        f"| evidence | {_cell(summary.evidence or '-')} ({summary.evidence_items} items, "
        f"{summary.evidence_missing} missing) |",
        f"| checkpoint used | {_cell(summary.resumed_from or '(start)')} |",
        f"| newest checkpoint | {_cell(summary.newest_checkpoint or '-')} |",
        f"| duration | {summary.duration_seconds:.1f} s |",
        f"| GPU-seconds | {summary.gpu_seconds:.1f} ({summary.gpus} GPU x wall time) |",
    ]
    lines += _checkpoint_rows(summary) + _placement_rows(summary) + _storage_rows(summary)
    if decision is not None:
        lines.append(f"| next | {_cell(decision.reason or '-')} |")
    if summary.signature:
        lines += ["", "## Deciding log line", "", fenced(_signature(summary))]
    lines += _stacks(summary)
    lines += _links(summary)
    lines += ["", "## All attempts of this run", "", render_table([*earlier, summary])]
    return "\n".join(lines)


def _checkpoint_rows(summary: AttemptSummary) -> list[str]:
    """What the checkpoints say: the kind and step of the one used and of the newest, the steps lost, how fast
    a checkpoint followed the notice; only what the attempt's records show."""
    def which(kind: str | None, step: int | None) -> str:
        return f"{_cell(kind or 'unknown')}{f', step {step}' if step is not None else ''}"

    rows: list[str] = []
    if summary.resumed_from and (summary.resumed_from_kind or summary.resumed_from_step is not None):
        rows.append(f"| resumed from | a {which(summary.resumed_from_kind, summary.resumed_from_step)} checkpoint |")
    if summary.newest_checkpoint and (summary.newest_checkpoint_kind or summary.newest_checkpoint_step is not None):
        rows.append(f"| newest checkpoint left | a {which(summary.newest_checkpoint_kind, summary.newest_checkpoint_step)} "
                    "checkpoint |")
    if summary.steps_lost is not None and not summary.succeeded:
        resumes = summary.newest_checkpoint_step if summary.newest_checkpoint else 0
        rows.append(f"| steps lost | {summary.steps_lost} (its last step {summary.progress_step}; the next attempt "
                    f"resumes from step {resumes}) |")
    if summary.notice_to_ack_seconds is not None:
        rows.append(f"| notice to checkpoint | {summary.notice_to_ack_seconds:.1f} s from the notice to the newest "
                    "checkpoint's acknowledgement |")
    return rows


def _placement_rows(summary: AttemptSummary) -> list[str]:
    """Where the attempt was kept off, how it was placed, and its memory, where any of it differs from the plain."""
    rows: list[str] = []
    if summary.avoided_nodes:
        rows.append(f"| kept off | {_cell(', '.join(summary.avoided_nodes))} (nodes where earlier attempts' "
                    "culprits had a GPU fault or a node failure) |")
    if summary.placement:
        rows.append(f"| placement | {_cell(summary.placement)} |")
    if summary.memory_factor != 1.0:
        rows.append(f"| memory | {summary.memory_factor:g}x the backend's memory request and limit "
                    "(raised after a host OOM) |")
    if summary.avoid_list or summary.avoid_note:
        rows.append(f"| shared avoid list | {_avoid(summary)} |")
    return rows


def _storage_rows(summary: AttemptSummary) -> list[str]:
    """Storage failures, and evidence still on its way to the object store."""
    rows: list[str] = []
    for problem in summary.storage_problems:
        rows.append(f"| **storage failed** | {_cell(problem)} |")
    if summary.evidence_spooled and summary.evidence_uploading:
        rows.append(f"| uploading | {len(summary.evidence_spooled)} items go up to the object store after the "
                    "verdict, from the local spool; this report is updated once they are up |")
    elif summary.evidence_spooled:
        rows.append(f"| not yet uploaded | {len(summary.evidence_spooled)} items wait in the local spool "
                    f"({_cell(summary.evidence_upload_error or 'upload pending')}); "
                    "`trainguard evidence flush` uploads them |")
    return rows


def _avoid(summary: AttemptSummary) -> str:
    """The avoid list's entries in force at launch, and whether the attempt was kept off them."""
    nodes = ", ".join(_cell(str(entry.get("node", "?"))) for entry in summary.avoid_list[:20])
    listed = f"{len(summary.avoid_list)} in force ({nodes})" if summary.avoid_list else "none in force"
    return f"{listed}; **{_cell(summary.avoid_note)}**" if summary.avoid_note else f"{listed}; kept off them"


def _culprit_rows(summary: AttemptSummary) -> list[str]:
    """Who started it, whom it took down with it, and how sure the call is."""
    rows = []
    root = summary.root_cause or {}
    if summary.culprit_undetermined:
        rows.append("| root cause | undetermined: every rank's own error was a peer's loss (a hang or desync) |")
    elif root.get("rank") is not None:
        where = " ".join(f"{label} {_cell(str(root[key]))}" for key, label in
                         (("index", "node index"), ("pod", "pod"), ("node", "on")) if root.get(key) not in (None, ""))
        when = f", first error {_cell(str(root['first_error_at']))}" if root.get("first_error_at") else ""
        lead = f", {root['margin_seconds']:.1f} s before the next" \
            if isinstance(root.get("margin_seconds"), int | float) else ""
        rows.append(f"| root cause | rank {root['rank']} ({where}{when}{lead}) |")
    if summary.victims:
        shown = [f"rank {_cell(str(v.get('rank', '?')))} ({_cell(str(v.get('reason', '')))})"
                 for v in summary.victims[:8]]
        more = f"; and {len(summary.victims) - 8} more" if len(summary.victims) > 8 else ""
        rows.append(f"| passed over | {'; '.join(shown)}{more} |")
    if sure := certainty(summary):
        rows.append(f"| how sure | {_cell(sure)} |")
    return rows


def _stacks(summary: AttemptSummary) -> list[str]:
    """Every rank's stack, taken while the ranks were alive: who waited where, and the odd one out."""
    table = summary.stacks
    if not table:
        return []
    rows = table.get("rows") or []
    lines = ["", "## Every rank's stack before the attempt was ended", "", _text(str(table.get("reason", ""))), "",
             "| rank | node | state | top frames | where it differs |", "|---|---|---|---|---|"]
    for row in rows[:256]:
        top = "; ".join(str(frame) for frame in (row.get("top") or [])[:3])
        lines.append(f"| {_cell(str(row.get('rank')))} | {_cell(str(row.get('node') or '-'))} | "
                     f"{_cell(str(row.get('state')))} | {_cell(top or '-')} | {_cell(str(row.get('differs') or '-'))} |")
    left = table.get("left_out")
    left_out = left if isinstance(left, int) else max(0, len(rows) - 256)
    if left_out > 0:
        found = table.get("states")
        states: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        counted = ", ".join(f"{_cell(str(state))}: {_cell(str(n))}" for state, n in list(states.items())[:8])
        lines.append(f"| ... | | {left_out} more ranks in the evidence's {STACKS_TABLE} | "
                     f"{counted or '-'} | |")
    return lines


def _node(summary: AttemptSummary) -> str:
    """Where the attempt ran, and whether the next attempt keeps off it (node names are untrusted too)."""
    if not summary.node:
        return "-"
    avoided = summary.decision is not None and summary.node in summary.decision.avoid_nodes
    return _cell(summary.node) + (" (the next attempt avoids it)" if avoided else "")


def _links(summary: AttemptSummary) -> list[str]:
    """The evidence items as links (presigned ones expire); spooled items are named, not linked."""
    if not summary.evidence_links and not summary.evidence_spooled:
        return []
    expiry = f" (links expire {summary.evidence_links_expire_at})" if summary.evidence_links_expire_at else ""
    lines = ["", f"## Evidence{expiry}", ""]
    local = {name: url for name, url in summary.evidence_links.items() if url.startswith("file://")}
    for name, url in summary.evidence_links.items():
        if name not in summary.evidence_spooled and name not in local:
            label = _cell(name)  # escaped: brackets included
            lines.append(f"- [{label}](<{url.replace('>', '%3E')}>)")
    if local:  # no browser opens a file:// link from the UI: the commands that read the folder do
        lines += _folder_commands(summary, local)
    waiting = "uploading" if summary.evidence_uploading else "spooled, not uploaded yet"
    lines += [f"- {_cell(name)} ({waiting})" for name in summary.evidence_spooled]
    return lines


def _folder_commands(summary: AttemptSummary, links: Mapping[str, str]) -> list[str]:
    """The `trainguard evidence` command lines that show and fetch a folder store's items."""
    path = urllib.parse.unquote(urllib.parse.urlparse(next(iter(links.values()))).path)
    marker = f"/runs/{summary.run_id}/attempt-{summary.attempt}/"
    root = path[:path.index(marker)] if marker in path else ""
    where = f" --root {shlex.quote(root)}" if root else ""
    commands = [f"trainguard evidence show {shlex.quote(summary.run_id)}{where}"]
    commands += [f"trainguard evidence get {shlex.quote(summary.run_id)} {summary.attempt} {shlex.quote(name)} "
                 f"-o {shlex.quote(name.rsplit('/', 1)[-1])}{where}" for name in links]
    return ["The evidence folder is on the machine that ran the attempt; there, these show and fetch it:", "",
            fenced("\n".join(commands))]


def render_table(summaries: Sequence[AttemptSummary]) -> str:
    """The attempts as a Markdown table."""
    header = "| " + " | ".join(TABLE_COLUMNS) + " |"
    rule = "|" + "---|" * len(TABLE_COLUMNS)
    rows = ["| " + " | ".join(_wrappable(_cell(v)) for v in table_row(s).values()) + " |" for s in summaries]
    return "\n".join([header, rule, *rows])


_LONG_PATH = re.compile(r"\S{30,}")


def _wrappable(cell: str) -> str:
    """A cell whose long paths may wrap after each "/": the Prefect UI lays a table out no narrower than
    its longest unbreakable word and clips what does not fit, with no scroll bar to reach it."""
    return _LONG_PATH.sub(lambda m: m.group(0).replace("/", "/\u200b"), cell)


def _signature(summary: AttemptSummary) -> str:
    if not summary.signature:
        return ""
    where = f"L{summary.line_number}: " if summary.line_number else ""
    return where + summary.signature


def fenced(text: str) -> str:
    """``text`` (masked, control sequences stripped) as a fenced code block no content can close."""
    body = masking.for_people(text)
    longest = max((len(run) for run in _BACKTICKS.findall(body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{body}\n{fence}"


def _text(text: str) -> str:
    """Untrusted text as inert Markdown: masked, HTML-escaped, Markdown punctuation escaped."""
    return _MARKDOWN_SPECIALS.sub(r"\\\1", html.escape(masking.for_people(text), quote=False))


def _cell(text: str) -> str:
    # cut before escaping, so a cut never splits an escape and leaves a bare "\" before the cell's "|"
    return _text(" ".join(text.splitlines())[:300])
