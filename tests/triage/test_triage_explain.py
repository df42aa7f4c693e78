"""Explaining a verdict, weak calls, and the mechanism sentence every shipped rule carries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trainguard.core import triage
from trainguard.core.taxonomy import Category

REPO = Path(__file__).parents[2]
OOM_THEN_WATCHDOG = (
    b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    b"[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout\n")


def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "trainguard.cli", "classify", *args],
                          input=stdin, capture_output=True, env=env, timeout=120, check=False)


def test_every_shipped_rule_says_which_mechanism_it_recognises() -> None:
    missing = [r.id for r in triage.load_rules().rules if len(r.description.split()) < 5]
    assert missing == []


def test_the_explanation_lists_every_matching_rule_strongest_first_and_why_the_winner_won() -> None:
    explanation = triage.explain(triage.Signals(exit_code=1, log=OOM_THEN_WATCHDOG))
    assert explanation.diagnosis is not None
    assert explanation.diagnosis.rule_id == "cuda_oom.torch"
    ids = [e.rule_id for e in explanation.evidence]
    assert ids[0] == "cuda_oom.torch" and "nccl.timeout" in ids
    strengths = [e.strength for e in explanation.evidence]
    assert strengths.index("cause") < strengths.index("consequence")
    assert explanation.evidence[0].line_number == 1 and explanation.evidence[0].rank == 3
    assert "strongest evidence (cause)" in explanation.reason
    assert "consequence" in explanation.reason


def test_a_tie_is_explained_by_the_earliest_line() -> None:
    log = b"Segmentation fault (core dumped)\nFatal Python error: Segmentation fault\n"
    explanation = triage.explain(triage.Signals(exit_code=139, log=log))
    assert "earliest log line" in explanation.reason


def test_a_failing_subsystem_is_a_weak_call_rather_than_unknown() -> None:
    log = b"epoch 3 step 1200\nuploading shard to the s3 bucket failed after 3 attempts\n"
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=log))
    assert diagnosis is not None
    assert diagnosis.category is Category.TRANSIENT_IO
    assert diagnosis.weak and diagnosis.strength == "hint"
    assert diagnosis.remediation.startswith("Weak call")
    assert diagnosis.to_dict()["weak"] is True


CUT_OFF_IN_A_REMOTE_CALL = (
    b"Traceback (most recent call last):\n"
    b'  File "/opt/venv/lib/python3.11/site-packages/fsspec/implementations/http.py", line 614, '
    b"in async_fetch_range\n"
    b"    out = await r.read()\n"
    b'  File "/opt/venv/lib/python3.11/site-packages/aiohttp/streams.py", line 392, in readany\n'
    b'    await self._wait("readany")\n')


def test_a_traceback_cut_off_inside_a_remote_call_is_a_guess_that_any_named_error_beats() -> None:
    explanation = triage.explain(triage.Signals(exit_code=1, log=CUT_OFF_IN_A_REMOTE_CALL))
    diagnosis = explanation.diagnosis
    assert diagnosis is not None and diagnosis.rule_id == "subsystem.network_frames"
    assert diagnosis.category is Category.TRANSIENT_IO
    assert diagnosis.weak and diagnosis.strength == "guess"
    assert "a guess" in explanation.reason and diagnosis.remediation.startswith("Weak call")
    # The same frames with the exception that ended them: the exception decides, even a hint.
    for last, category in ((b"ValueError: bad shard header\n", Category.CODE_ERROR),
                           (b"RuntimeError: worker gave up\n", Category.CODE_ERROR)):
        named = triage.classify(triage.Signals(exit_code=1, log=CUT_OFF_IN_A_REMOTE_CALL + last))
        assert named is not None and named.category is category, last


def test_a_decisive_rule_is_not_a_weak_call_and_nothing_at_all_is_one() -> None:
    strong = triage.classify(triage.Signals(exit_code=1, log=OOM_THEN_WATCHDOG))
    nothing = triage.classify(triage.Signals(exit_code=3, log=b"bye\n"))
    assert strong is not None and not strong.weak
    assert nothing is not None and nothing.category is Category.UNKNOWN and nothing.weak


def test_the_cli_explains_in_json_and_reads_stdin_once() -> None:
    done = cli("-", "--exit-code", "1", "--explain", "--json", stdin=OOM_THEN_WATCHDOG)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["category"] == "cuda_oom"
    assert result["evidence"][0]["rule_id"] == "cuda_oom.torch"
    assert result["evidence"][0]["mechanism"]
    assert "strongest evidence" in result["reason"]


def test_the_cli_explains_for_people_without_reading_log_text_as_markup() -> None:
    log = b"[rank3]: torch.OutOfMemoryError: CUDA out of memory [bold]x[/bold]\n"
    done = cli("-", "--exit-code", "1", "--explain", stdin=log)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "evidence, strongest first" in out and "why:" in out
    assert "[bold]x[/bold]" in out


def test_an_unknown_engine_is_one_line_naming_the_option() -> None:
    done = cli("-", "--engine", "fast", stdin=b"x\n")
    assert done.returncode == 2
    assert done.stderr.decode().count("\n") == 1 and "--engine" in done.stderr.decode()
