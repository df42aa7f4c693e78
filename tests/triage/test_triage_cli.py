"""``trainguard classify`` as other tools call it: a subprocess, its stdout and its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]
OOM = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n"


def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", "from trainguard.cli import main; main()", "classify", *args],
        input=stdin, capture_output=True, cwd=REPO, env=env, timeout=60, check=False)


def test_a_log_file_with_json_output(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 1\n" + OOM)
    done = cli(str(log), "--exit-code", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["category"], result["retryable"], result["line_number"], result["rank"]) == (
        "cuda_oom", False, 2, 1)


def test_the_log_on_stdin_with_human_output() -> None:
    done = cli("-", stdin=OOM.encode())
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "cuda_oom" in out and "do not retry" in out and "cuda_oom.torch" in out


def test_reason_and_events_file_without_a_log(tmp_path: Path) -> None:
    events = tmp_path / "events.json"
    events.write_text(json.dumps({"kind": "EventList", "items": [
        {"reason": "FailedScheduling", "message": "0/3 nodes are available: 3 Insufficient "
         "nvidia.com/gpu."}]}))
    done = cli("--events", str(events), "--json")
    assert json.loads(done.stdout)["category"] == "unschedulable"
    done = cli("--reason", "OOMKilled", "--exit-code", "137", "--json")
    assert json.loads(done.stdout)["category"] == "host_oom"


def test_a_success_prints_a_null_category() -> None:
    done = cli("-", "--exit-code", "0", "--json", stdin=b"/x.py:3: FutureWarning: old\n")
    assert done.returncode == 0
    assert json.loads(done.stdout)["category"] is None


def test_batch_mode_keeps_order_and_marks_successes_null() -> None:
    lines = [
        {"log": OOM, "exit_code": 1, "reason": None, "events": None},
        {"log": None, "exit_code": 0, "reason": None, "events": None},
        {"log": None, "exit_code": 137, "reason": "OOMKilled", "events": []},
        {"log": "x", "exit_code": None, "reason": None,
         "events": "2m  Warning  NodeNotReady  pod/t-0  Node is not ready"},
    ]
    stdin = "".join(json.dumps(line) + "\n" for line in lines).encode()
    done = cli("--jsonl", "-", stdin=stdin)
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [o["category"] for o in out] == ["cuda_oom", None, "host_oom", "node_failure"]
    for o in out:
        assert {"category", "retryable", "rule_id", "signature", "fingerprint", "line_number",
                "rank", "remediation"} <= set(o)


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad_rules = tmp_path / "rules.yaml"
    bad_rules.write_text("rules:\n  - id: a.b\n    category: nope\n    log: [x]\n")
    cases = [
        cli("-", "--exit-code", "abc", stdin=b"x"),
        cli(str(tmp_path / "missing.log")),
        cli("--jsonl", "-", stdin=b'{"log": 3}\n'),
        cli("--jsonl", "-", stdin=b"not json\n"),
        cli("--jsonl", "-", stdin=b'{"exit_code": "1"}\n'),
        cli("-", "--rules", str(bad_rules), stdin=b"x"),
    ]
    for done in cases:
        err = done.stderr.decode().strip()
        assert done.returncode == 2, err
        assert len(err.splitlines()) == 1 and err.startswith("trainguard classify: error: "), err
    assert "exit_code" in cases[4].stderr.decode() and "line 1" in cases[4].stderr.decode()
    assert f"{bad_rules}:3" in cases[5].stderr.decode()


def test_help_and_refused_options_are_answered_by_the_full_command_parser() -> None:
    # A plain command line is parsed without building the typer command; these are not plain.
    helped, refused = cli("--help"), cli("-", "--no-such-option", stdin=b"x")
    assert helped.returncode == 0 and b"--exit-code" in helped.stdout and b"--explain" in helped.stdout
    assert refused.returncode == 2 and b"No such option" in refused.stderr


def test_tokens_are_masked_and_terminal_sequences_leave_no_text_behind(tmp_path: Path) -> None:
    token = "hf_" + "a" * 34
    log = tmp_path / "train.log"
    log.write_text(f"step 1\n\x1b]0;owned title\x07\x1b[31mRuntimeError: bad batch, token {token}\x1b[0m\n")
    human = cli(str(log), "--exit-code", "1", "--explain")
    as_json = cli(str(log), "--exit-code", "1", "--json", "--explain")
    batch = cli("--jsonl", "-", stdin=json.dumps({"log": log.read_text(), "exit_code": 1}).encode() + b"\n")

    for done in (human, as_json, batch):
        out = done.stdout.decode()
        assert done.returncode == 0, done.stderr
        assert token not in out and "owned title" not in out and "\x1b" not in out and "\\u001b" not in out, out
    assert "RuntimeError: bad batch, token ***" in human.stdout.decode()
    assert json.loads(as_json.stdout)["signature"] == "RuntimeError: bad batch, token ***"


def test_events_and_batch_records_nested_beyond_reading_are_one_line_and_exit_2(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    events = tmp_path / "events.json"
    events.write_text(deep)
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules: " + deep + "\n")
    cases = [
        cli("--events", str(events), "--exit-code", "1"),
        cli("--jsonl", "-", stdin=('{"log": "x", "events": ' + deep + "}\n").encode()),
        cli("-", "--rules", str(rules), stdin=b"x"),
    ]
    for done in cases:
        err = done.stderr.decode().strip()
        assert done.returncode == 2, err[-2000:]
        assert len(err.splitlines()) == 1 and err.startswith("trainguard classify: error: "), err[-2000:]
        assert "nest" in err


def test_an_undecided_failure_shows_its_nearest_labelled_failures_and_votes_only_when_asked() -> None:
    rows = [json.loads(line) for line in
            (REPO / "tests" / "triage" / "corpus" / "blind3.jsonl").read_text().splitlines() if line]
    log = next(r for r in rows if r["id"] == "k-034")["log"].encode()  # OpenPCDet#1047
    shown = cli("-", "--exit-code", "1", stdin=log)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.decode()
    assert "looks like" in out and "open-mmlab/OpenPCDet/issues/1047" in out and "weak lead" in out
    assert "fallback.unknown" in out
    voted = cli("-", "--exit-code", "1", "--json", "--nearest-vote", stdin=log)
    result = json.loads(voted.stdout)
    assert (result["rule_id"], result["strength"], result["weak"]) == ("nearest.vote", "guess", True)
    assert result["nearest"][0]["source"] == "https://github.com/open-mmlab/OpenPCDet/issues/1047"
