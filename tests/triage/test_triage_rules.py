"""Rules are data: a user's rule file layers on the shipped one and is validated on load."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.core import triage
from trainguard.core.taxonomy import Category
from trainguard.core.triage.rules import parse_rule_file, shipped_rules_text

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "my-rules.yaml"
    path.write_text(text)
    return path


def test_every_shipped_rule_names_a_category_and_has_a_matcher() -> None:
    rules = triage.load_rules()
    assert len({r.id for r in rules.rules}) == len(rules.rules) > 40
    for rule in rules.rules:
        assert rule.log or rule.has_platform_matchers, rule.id


def test_every_shipped_pattern_is_checked_though_start_up_compiles_none() -> None:
    # load_rules leaves compiling the shipped patterns to their first use; checked like a user's
    # file, a broken shipped pattern would be refused here, naming its rule and field.
    checked, _ = parse_rule_file(shipped_rules_text(), "rules.yaml")
    unchecked, _ = parse_rule_file(shipped_rules_text(), "rules.yaml", check_patterns=False)
    assert not any("log_res" in vars(rule) for rule in unchecked)  # nothing compiled yet
    assert [r.log for r in checked] == [r.log for r in unchecked]
    assert all(r.pattern == p for rule in unchecked for r, p in zip(rule.log_res, rule.log))


def test_a_user_rule_reclassifies_a_pattern(tmp_path: Path) -> None:
    path = write(tmp_path, """
rules:
  - id: site.flaky_ecc_on_rack7
    category: transient_io
    retryable: true
    log: ['uncorrectable ECC error']
""")
    diagnosis = triage.classify(triage.Signals(exit_code=1, log=ECC), rules=triage.load_rules(path))
    assert diagnosis is not None
    assert (diagnosis.category, diagnosis.rule_id) == (Category.TRANSIENT_IO,
                                                       "site.flaky_ecc_on_rack7")
    shipped = triage.classify(triage.Signals(exit_code=1, log=ECC))
    assert shipped is not None and shipped.category is Category.GPU_FAULT


@pytest.mark.parametrize("engine", ["hyperscan", "re"])
def test_a_line_one_pattern_of_a_rule_rejects_is_still_tried_against_its_others(
        tmp_path: Path, engine: str) -> None:
    # Both patterns hold the literal "Killed", so both are candidates on the line; the first
    # rejects it. The line was then taken as tried for the whole rule, and lost.
    path = write(tmp_path, """
rules:
  - id: site.killed
    category: host_oom
    log: ['^Killed$', 'Killed\\s+python[\\d.]*\\b']
""")
    log = "step 10\n/usr/local/bin/train.sh: line 18:    36 Killed      python3 train.py\n"
    diagnosis = triage.classify(triage.Signals(exit_code=137, log=log),
                                rules=triage.load_rules(path), engine=engine)
    assert diagnosis is not None
    assert (diagnosis.rule_id, diagnosis.line_number) == ("site.killed", 2)


def test_a_user_rule_with_a_shipped_id_replaces_it_in_place(tmp_path: Path) -> None:
    path = write(tmp_path, """
rules:
  - id: cuda_oom.torch
    category: cuda_oom
    retryable: true
    log: ['CUDA out of memory']
  - id: native.segfault
    category: native_crash
    disabled: true
""")
    rules = triage.load_rules(path)
    ids = [r.id for r in rules.rules]
    assert ids.count("cuda_oom.torch") == 1 and "native.segfault" not in ids
    assert ids.index("cuda_oom.torch") == [r.id for r in triage.load_rules().rules].index(
        "cuda_oom.torch")
    diagnosis = triage.classify(triage.Signals(exit_code=1, log="CUDA out of memory."), rules=rules)
    assert diagnosis is not None and diagnosis.retryable is True


def test_a_user_rule_can_match_platform_signals_together(tmp_path: Path) -> None:
    path = write(tmp_path, """
rules:
  - id: site.sigkill_with_killed_line
    category: host_oom
    strength: verdict
    signals: [SIGKILL]
    log: ['^Killed$']
""")
    rules = triage.load_rules(path)
    hit = triage.classify(triage.Signals(exit_code=137, log="step 1\nKilled\n"), rules=rules)
    assert hit is not None and hit.rule_id == "site.sigkill_with_killed_line"
    miss = triage.classify(triage.Signals(exit_code=1, log="step 1\nKilled\n"), rules=rules)
    assert miss is not None and miss.rule_id != "site.sigkill_with_killed_line"


BAD_FILES = [
    ("unknown_category", "rules:\n  - id: a.b\n    category: cuda-oom\n    log: [x]\n",
     3, "rules[0] (a.b).category"),
    ("bad_regex", "rules:\n  - id: a.b\n    category: cuda_oom\n    log: ['CUDA (out']\n",
     4, "rules[0] (a.b).log"),
    ("unknown_field", "rules:\n  - id: a.b\n    category: cuda_oom\n    logs: [x]\n",
     4, "rules[0] (a.b).logs"),
    ("no_matcher", "rules:\n  - id: a.b\n    category: cuda_oom\n", 2, "rules[0] (a.b).log"),
    ("bad_signal", "rules:\n  - id: a.b\n    category: native_crash\n    signals: [SIGFOO]\n",
     4, "signals"),
    ("duplicate_id", "rules:\n  - id: a.b\n    category: unknown\n    log: [x]\n"
     "  - id: a.b\n    category: unknown\n    log: [y]\n", 5, "rules[1] (a.b).id"),
    ("bad_strength", "rules:\n  - id: a.b\n    category: unknown\n    strength: huge\n    log: [x]\n",
     4, "strength"),
    ("not_yaml", "rules:\n  - id: a.b\n   category: [unclosed\n", 3, "not valid YAML"),
    ("no_rules_list", "version: 1\n", 1, "rules"),
]


@pytest.mark.parametrize("text,line,field", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_an_invalid_rule_file_is_refused_naming_file_line_and_field(
        tmp_path: Path, text: str, line: int, field: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(triage.RuleFileError) as info:
        triage.load_rules(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert field in message
    assert "\n" not in message


def test_a_missing_rule_file_is_a_rule_file_error(tmp_path: Path) -> None:
    with pytest.raises(triage.RuleFileError, match="cannot read the rule file"):
        triage.load_rules(tmp_path / "absent.yaml")
