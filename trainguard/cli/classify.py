"""``trainguard classify``: triage a failed attempt from a log, exit code, reason and events.

Parsing the command line and the batch JSON Lines, and printing results, belong here; every
decision is ``trainguard.core.triage``'s. No Prefect import: the command must start fast.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import typer

from trainguard.cli.typer_app import app
from trainguard.core import masking, triage

_EMPTY: dict[str, Any] = {
    k: None for k in ("category", "retryable", "rule_id", "signature", "line_number", "rank",
                      "remediation", "fingerprint", "strength", "weak", "culprit_undetermined",
                      "decided_by", "failed_at", "provenance")}
_EMPTY["victims"] = []
_EMPTY["nearest"] = []


class InputError(ValueError):
    """Bad input: reported as one line on stderr with exit code 2."""


@app.command("classify")
def classify_command(
    log: str | None = typer.Argument(None, help="The attempt's log file, or - for stdin."),
    exit_code: str | None = typer.Option(None, "--exit-code", help="The container's exit code."),
    reason: str | None = typer.Option(None, "--reason", help="Termination reason, e.g. OOMKilled."),
    events: str | None = typer.Option(
        None, "--events", help="Kubernetes events: a JSON list/EventList or kubectl text."),
    rules: str | None = typer.Option(None, "--rules", help="Your rule file, layered on ours."),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON."),
    jsonl: str | None = typer.Option(
        None, "--jsonl", help="Batch: JSON Lines file (or - for stdin), one failure per line."),
    engine: str = typer.Option(
        "auto", "--engine", help="Log scanner: auto (Hyperscan when installed), hyperscan or re."),
    explain: bool = typer.Option(
        False, "--explain", help="Also list every rule that matched, its strength and line, "
                                 "and why the winner won."),
    error_file: list[str] | None = typer.Option(
        None, "--error-file", help="A torchelastic error file (TORCHELASTIC_ERROR_FILE, or a "
                                   "rank's error.json under torchrun's --log-dir); repeatable."),
    nearest_vote: bool = typer.Option(
        False, "--nearest-vote", help="When no rule decides, let the nearest labelled public "
                                      "failures' weak vote decide instead of unknown."),
) -> None:
    """Say which failure category an attempt belongs to and whether a retry can help."""
    try:
        ruleset = triage.load_rules(rules)
        if engine not in ("auto", "hyperscan", "re"):
            raise InputError(f"--engine: {engine!r}; expected auto, hyperscan or re")
        if engine == "hyperscan" and not triage.hyperscan_available():
            raise InputError("--engine hyperscan: hyperscan cannot be imported here; "
                             "install it or use --engine auto")
        if jsonl is not None:
            if log is not None:
                raise InputError("give either LOG or --jsonl, not both")
            _batch(jsonl, ruleset, engine, explain, nearest_vote)
            return
        signals = triage.Signals(
            exit_code=_int_option("--exit-code", exit_code), reason=reason,
            events=_read_events(events) if events else (), log=_log_source(log),
            error_files=_read_error_files(error_file or []),
        )
        explanation = triage.explain(signals, rules=ruleset, engine=engine,
                                     nearest_vote=nearest_vote)
    except (InputError, triage.RuleFileError) as exc:
        _fail(str(exc))
    diagnosis = explanation.diagnosis
    if as_json:
        result = diagnosis.to_dict() if diagnosis else dict(_EMPTY)
        if explain:
            result.update(_explanation_fields(explanation))
        print(json.dumps(_for_people(result)))
        return
    _show(diagnosis)
    if explain:
        _show_explanation(explanation)


def classify_click_command() -> Callable[..., Any]:
    """This command on its own, for ``trainguard classify``: no other command module is loaded."""
    alone = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    alone.command("classify")(classify_command)
    return typer.main.get_command(alone)


class _NotPlain(Exception):
    """The command line needs the full parser: help, or an option it refuses."""


class _PlainParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _NotPlain(message)


def run_alone(argv: list[str]) -> None:
    """Run ``trainguard classify`` with ``argv``, as the typer command would.

    Building a typer command costs more start-up than reading a large log's first gigabyte takes
    grep (this typer builds a pydantic adapter per parameter), so a plain command line is parsed
    here from the command's own parameter declarations; help and refused options go to the typer
    command, which answers them as always.
    """
    if any(a in ("--help", "-h") for a in argv):
        classify_click_command()(argv, prog_name="trainguard classify")
        return
    parser = _PlainParser(prog="trainguard classify", add_help=False, allow_abbrev=False)
    for name, param in inspect.signature(classify_command).parameters.items():
        info = param.default
        if isinstance(info, typer.models.ArgumentInfo):
            parser.add_argument(name, nargs="?", default=info.default)
        elif param.annotation in (bool, "bool"):
            parser.add_argument(*info.param_decls, dest=name, action="store_true")
        elif str(param.annotation).startswith("list["):
            parser.add_argument(*info.param_decls, dest=name, action="append")
        else:
            parser.add_argument(*info.param_decls, dest=name, default=info.default)
    try:
        values = vars(parser.parse_args(argv))
    except _NotPlain:
        classify_click_command()(argv, prog_name="trainguard classify")
        return
    try:
        classify_command(**values)
    except typer.Exit as done:
        raise SystemExit(done.exit_code) from None


def _fail(message: str) -> NoReturn:
    print(f"trainguard classify: error: {message}", file=sys.stderr)
    raise typer.Exit(2)


def _int_option(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"{name}: expected a whole number such as 137, got {value!r}") from None


def _log_source(log: str | None) -> Path | BinaryIO | None:
    if log is None:
        return None
    if log == "-":
        return sys.stdin.buffer
    path = Path(log)
    if not path.is_file():
        raise InputError(f"LOG: {log}: no such file; give a log file or - for stdin")
    return path


def _read_error_files(paths: list[str]) -> tuple[triage.ErrorFile, ...]:
    found = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise InputError(f"--error-file: cannot read {path}: {exc.strerror}") from None
        parsed = triage.parse_error_file(data, source=path)
        if parsed is not None:  # empty: the rank was killed by a signal and wrote nothing
            found.append(parsed)
    return tuple(found)


def _error_files_value(data: Any, where: str) -> tuple[triage.ErrorFile, ...]:
    """A record's ``error_files``: each the file's content, or {"content", "rank", "source"}."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise InputError(f"{where}: error_files: expected a list of error file contents or null")
    found = []
    for item in data:
        if isinstance(item, str):
            parsed = triage.parse_error_file(item)
        elif isinstance(item, dict) and isinstance(item.get("content"), str):
            rank = item.get("rank")
            parsed = triage.parse_error_file(
                item["content"], rank=rank if isinstance(rank, int) else None,
                source=item.get("source") if isinstance(item.get("source"), str) else None)
        else:
            raise InputError(f"{where}: error_files: each entry is a file's content or an "
                             "object with 'content' (and 'rank', 'source')")
        if parsed is not None:
            found.append(parsed)
    return tuple(found)


def _read_events(path: str) -> tuple[Mapping[str, Any], ...] | str:
    try:
        text = Path(path).read_text("utf-8", "replace")
    except OSError as exc:
        raise InputError(f"--events: cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError:
        return text  # `kubectl get events` text
    except RecursionError:
        raise InputError(f"--events {path}: nested too deeply to read; give a list of event objects") from None
    return _events_value(data, f"--events {path}")


def _events_value(data: Any, where: str) -> tuple[Mapping[str, Any], ...] | str:
    if data is None:
        return ()
    if isinstance(data, str):
        return data
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        data = data["items"]  # an EventList
    if isinstance(data, list) and all(isinstance(e, dict) for e in data):
        return tuple(data)
    raise InputError(f"{where}: events: expected a list of event objects, an EventList, "
                     "kubectl text or null")


def _explanation_fields(explanation: triage.Explanation) -> dict[str, Any]:
    data = explanation.to_dict()
    return {"evidence": data["evidence"], "reason": data["reason"]}


def _batch(source: str, ruleset: triage.RuleSet, engine: str, explain: bool,
           nearest_vote: bool = False) -> None:
    out = sys.stdout
    for number, record in _records(source):
        where = f"{'stdin' if source == '-' else source} line {number}"
        explanation = triage.explain(_signals(record, where), rules=ruleset, engine=engine,
                                     nearest_vote=nearest_vote)
        diagnosis = explanation.diagnosis
        result = diagnosis.to_dict() if diagnosis else dict(_EMPTY)
        if explain:
            result.update(_explanation_fields(explanation))
        if "id" in record:
            result["id"] = record["id"]
        out.write(json.dumps(_for_people(result)) + "\n")
        out.flush()


def _records(source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        stream = sys.stdin if source == "-" else open(source, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"--jsonl: cannot read {source}: {exc.strerror}") from None
    with stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"line {number}: not valid JSON ({exc.msg} at column "
                                 f"{exc.colno}); expected one object per line") from None
            except RecursionError:
                raise InputError(f"line {number}: nested too deeply to read; expected one object per line") from None
            if not isinstance(record, dict):
                raise InputError(f"line {number}: expected a JSON object with keys log, "
                                 "exit_code, reason, events")
            yield number, record


def _signals(record: dict[str, Any], where: str) -> triage.Signals:
    log, code, reason = record.get("log"), record.get("exit_code"), record.get("reason")
    if log is not None and not isinstance(log, str):
        raise InputError(f"{where}: log: expected a string or null, got {type(log).__name__}")
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
        raise InputError(f"{where}: exit_code: expected a whole number or null, got {code!r}")
    if reason is not None and not isinstance(reason, str):
        raise InputError(f"{where}: reason: expected a string or null, got {reason!r}")
    conditions = record.get("conditions") or []
    if not isinstance(conditions, list) or not all(isinstance(c, dict) for c in conditions):
        raise InputError(f"{where}: conditions: expected a list of condition objects or null")
    return triage.Signals(exit_code=code, reason=reason, conditions=tuple(conditions),
                          events=_events_value(record.get("events"), where), log=log,
                          error_files=_error_files_value(record.get("error_files"), where))


def _show(diagnosis: triage.Diagnosis | None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    if diagnosis is None:
        console.print("[green]not a failure[/green]: exit code 0 and nothing says otherwise")
        return
    verdict = Text("retry", "green") if diagnosis.retryable else Text("do not retry", "red")
    where = f"line {diagnosis.line_number}" if diagnosis.line_number else "platform signal"
    if diagnosis.rank is not None:
        where += f", rank {diagnosis.rank}"
    table = Table(show_header=False, box=None, pad_edge=False)
    # Log text can hold "[...]" that rich would read as markup: pass it as plain Text.
    table.add_row("category", Text.assemble((diagnosis.category.value, "bold"), " (", verdict, ")"))
    table.add_row("evidence", Text(masking.for_people(f"{where}: {diagnosis.signature}")))
    table.add_row("rule", Text(diagnosis.rule_id))
    if diagnosis.culprit_undetermined:
        table.add_row("culprit", Text("undetermined: every failing rank only lost a peer",
                                      "yellow"))
    if diagnosis.weak:
        table.add_row("confidence", Text(
            "weak call: no decisive rule matched" if diagnosis.strength == "none"
            else f"weak call: decided by {diagnosis.decided_by}"
            if diagnosis.decided_by in ("rule order", "part order")
            else "weak call: read from the log alone, without the platform's record"
            if diagnosis.provenance == "log" and diagnosis.strength not in ("hint", "guess")
            else "weak call: only hint-strength evidence", "yellow"))
    for number, n in enumerate(diagnosis.nearest):
        table.add_row("looks like" if number == 0 else "", Text(masking.for_people(
            f"{n.source} ({n.category.value}, similarity {n.similarity:.2f}; a weak lead)")))
    table.add_row("fix", Text(diagnosis.remediation))
    table.add_row("fingerprint", Text(diagnosis.fingerprint))
    console.print(table)


def _show_explanation(explanation: triage.Explanation) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console()
    if explanation.evidence:
        console.print(Text("evidence, strongest first:", "bold"))
    for e in explanation.evidence:
        where = f"line {e.line_number}" if e.line_number else "platform signal"
        if e.origin is not None:
            where = f"{e.origin} {where}"
        if e.rank is not None:
            where += f", rank {e.rank}"
        if e.victim:
            where += " (victim)"
        # Log text can hold "[...]" that rich would read as markup: pass it as plain Text.
        console.print(Text.assemble(
            "  ", (f"{e.strength:<11}", "bold"), f" {e.rule_id} -> {e.category}, {where}: ",
            masking.for_people(e.text)))
    diagnosis = explanation.diagnosis
    if diagnosis is not None and (diagnosis.victims or diagnosis.culprit_undetermined):
        culprit = ("undetermined (only ranks that lost a peer are in the evidence)"
                   if diagnosis.culprit_undetermined else
                   "unknown rank" if diagnosis.rank is None else f"rank {diagnosis.rank}")
        console.print(Text.assemble(("culprit: ", "bold"), culprit))
        for v in diagnosis.victims:
            who = "lines naming no rank" if v.rank is None else f"rank {v.rank}"
            console.print(Text.assemble("  passed over: ", (who, "bold"), f" ({v.rule_id}): ",
                                        masking.for_people(v.reason)))
    console.print(Text.assemble(("why: ", "bold"), masking.for_people(explanation.reason)))


def _for_people(value: Any) -> Any:
    """A JSON-ready result with every string masked and stripped of terminal control sequences.

    Other tools print what they read from here, so no secret and no escape sequence of the log
    may pass through it.
    """
    if isinstance(value, str):
        return masking.for_people(value)
    if isinstance(value, dict):
        return {key: _for_people(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_for_people(item) for item in value]
    return value
