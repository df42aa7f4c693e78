"""torchrun's agent crashing on a dying worker's half-written error file is not the training's failure.

Recorded from a real run (`recorded/torchrun_error_file_race.log`, paths shortened): rank 3 is
SIGKILLed in step 17, the survivors' collectives fail, the agent SIGTERMs them, and one is ended
while `@record` writes its ``error.json``. The agent then reads the empty file and dies of its own
``JSONDecodeError`` before it prints the root-cause table. That traceback is the launcher's: it is
neither a data error (a JSON record that does not parse) nor a bug in the training (an uncaught
exception), and the attempt is retried. The same exception raised in a rank's own code still is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category
from trainguard.core.triage import scan
from trainguard.core.triage import load_rules
from trainguard.core.triage.rules import RuleFileError

RECORDED = Path(__file__).parent / "recorded" / "torchrun_error_file_race.log"

RANK_OWN = """\
[default1]:[rank1]: Traceback (most recent call last):
[default1]:[rank1]:   File "/src/train.py", line 93, in <module>
[default1]:[rank1]:     main()
[default1]:[rank1]:   File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
[default1]:[rank1]:     return f(*args, **kwargs)
[default1]:[rank1]:   File "/src/train.py", line 40, in main
[default1]:[rank1]:     labels = json.load(open(args.labels))
[default1]:[rank1]: json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)
"""


@pytest.mark.parametrize("block_bytes", [None, 64])
def test_the_agents_crash_on_an_empty_error_file_is_passed_over_and_the_attempt_retried(
        monkeypatch: pytest.MonkeyPatch, block_bytes: int | None) -> None:
    if block_bytes:  # the lines that veto it then lie in an earlier block than the exception's
        monkeypatch.setattr(scan, "BLOCK_BYTES", block_bytes)
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=RECORDED.read_text()), engine="re")

    assert diagnosis is not None
    assert (diagnosis.category, diagnosis.retryable) == (Category.NCCL_ERROR, True), diagnosis.rule_id
    assert "JSONDecodeError" not in diagnosis.signature and diagnosis.culprit_undetermined


def test_the_same_exception_in_a_ranks_own_code_is_still_its_data() -> None:
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=RANK_OWN), engine="re")

    assert diagnosis is not None and (diagnosis.category, diagnosis.rule_id) == (Category.DATA_ERROR, "data.not_found")


def test_a_veto_needs_a_line_to_veto(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nrules:\n  - id: mine.exit\n    category: code_error\n    exit_codes: [3]\n"
                     "    context_not: ['launcher']\n")

    with pytest.raises(RuleFileError, match=r"rules\.yaml:\d+: .*context_not: needs a 'log' pattern"):
        load_rules(rules)


def test_lines_a_veto_passes_over_do_not_use_up_the_rules_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # A rule stops looking after so many confirmed lines. With that limit at one, the agent's own
    # JSONDecodeError (vetoed) must not be the line that uses it up: a rank's own comes after it.
    monkeypatch.setattr(scan, "SATURATION", 1)
    monkeypatch.setattr(scan, "BLOCK_BYTES", 4096)  # the two lines in different blocks
    rules = load_rules()
    data_rule = next(i for i, rule in enumerate(rules.rules) if rule.id == "data.not_found")
    later = "".join(f"[default1]:step {n} loss 1.40\n" for n in range(40))  # past the veto's 30 lines
    log = RECORDED.read_text() + later + RANK_OWN

    hits = [hit for hit in scan.Scanner(rules, "re").scan(log).hits if hit.rule == data_rule]

    assert [hit.line_number for hit in hits] == [len(log.splitlines())], hits
