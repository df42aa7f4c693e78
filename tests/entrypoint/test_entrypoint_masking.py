"""What the entrypoint writes for people carries no secret and no terminal control sequence.

The raw log on the attempt's own volume keeps the bytes as printed; the crash report's tail,
command and problems are masked by value and shape, as CI systems mask secrets.
"""

from __future__ import annotations

import json

import pytest
from entrypoint_harness import py

from trainguard_entrypoint.redact import Masker, is_secret_name, redact_environment, strip_control

SECRET = "supersecret123"
WEBHOOK = "https://hooks.slack.com/services/T0123/B0456/abcdefXYZ123"


def test_secrets_the_command_prints_are_masked_in_the_crash_report_but_kept_in_the_raw_log(run_entrypoint) -> None:
    code = (
        "import os\n"
        "print('AWS_SECRET_ACCESS_KEY=' + os.environ['AWS_SECRET_ACCESS_KEY'])\n"
        "print('posting to', os.environ['SLACK_WEBHOOK'])\n"
        "print('token hf_' + 'a' * 34, 'key AKIA' + 'B' * 16, 'db postgres://me:pa55word@db/x')\n"
        "raise SystemExit(1)\n"
    )
    run = run_entrypoint([*py(code), "--api-key", SECRET], env={"AWS_SECRET_ACCESS_KEY": SECRET, "SLACK_WEBHOOK": WEBHOOK})

    report_text = (run.workspace / "crash-report.json").read_text()
    for leaked in (SECRET, "T0123/B0456", "hf_" + "a" * 34, "AKIA" + "B" * 16, "pa55word"):
        assert leaked not in report_text, leaked
    assert "AWS_SECRET_ACCESS_KEY=***" in run.report["log_tail"]
    assert SECRET.encode() in run.log  # the raw log on the attempt's volume stays as printed
    env_snapshot = (run.workspace / "snapshot" / "env.json").read_text()
    assert WEBHOOK not in env_snapshot and SECRET not in env_snapshot


def test_terminal_control_sequences_are_stripped_from_the_crash_reports_tail(run_entrypoint) -> None:
    code = r"print('\x1b[31mred\x1b[0m \x1b]0;owned title\x07\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ done')"
    run = run_entrypoint(py(code))

    assert run.report["log_tail"] == ["red click done"]
    assert b"\x1b[31m" in run.log


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("MY_TOKEN: 'abcdefgh'", "MY_TOKEN: '***'"),
        ("ghp_" + "x" * 36, "***"),
        ("xoxb-1234567890-abcdef", "***"),
        ("sort_key=loss lr=0.1", "sort_key=loss lr=0.1"),  # ordinary text stays readable
        ("HF_TOKEN=1", "HF_TOKEN=1"),  # too short to be a secret worth masking everywhere
        ("task-" + "a" * 24, "task-" + "a" * 24),  # "sk-" inside a word is no key
        ("retry-sk-" + "a" * 24, "retry-***"),
        ("monKEY=bananas12 DB_PASSWORD=hunter22", "monKEY=bananas12 DB_PASSWORD=***"),
        ("postgres+asyncpg://me:pa55word@db/x", "postgres+asyncpg://me:***@db/x"),
        ("aws_secret_access_key = wJalrXUtnFEMI", "aws_secret_access_key = ***"),  # ~/.aws/credentials
        ('{"api_key": "abcdef123456", "model": "bert"}', '{"api_key": "***", "model": "bert"}'),
        ("apiKey: abcdef123456", "apiKey: ***"),
        ("TOKENIZER_NAME: bert-base-uncased", "TOKENIZER_NAME: bert-base-uncased"),  # a word that starts like one
        ("KEYBOARD_LAYOUT=us-intl-alt", "KEYBOARD_LAYOUT=us-intl-alt"),
        ("KeyError: 'missing_column'", "KeyError: 'missing_column'"),  # a class name, not a variable
    ],
)
def test_token_shapes_and_secret_assignments_are_masked_and_ordinary_text_is_not(text: str, expected: str) -> None:
    assert Masker().mask(text) == expected


@pytest.mark.parametrize(
    ("name", "secret"),
    [("HF_TOKEN", True), ("aws_secret_access_key", True), ("apiKey", True), ("DBPASSWORD", True),
     ("GOOGLE_APPLICATION_CREDENTIALS", True), ("api-key", True), ("TOKENIZER_NAME", False),
     ("KEYBOARD_LAYOUT", False), ("max_tokens", False), ("MONKEY_PATCH", False), ("KeyError", False)],
)
def test_a_name_is_a_secrets_when_one_of_its_words_is(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_a_secret_containing_another_is_masked_whole() -> None:
    masker = Masker(["abcdef", "abcdefghij"])

    assert masker.mask("x abcdefghij y abcdef") == "x *** y ***"


def test_control_bytes_are_removed_but_tabs_are_kept() -> None:
    assert strip_control("a\tb\x07c\x1b[2Jd\x9b31me\r") == "a\tbcde"
    assert json.dumps(strip_control("\x1bP1;2|payload\x1b\\ok")) == '"ok"'


def _streamed(masker: Masker, text: str, sizes: list[int]) -> str:
    stream, out, index = masker.stream(), [], 0
    while index < len(text):
        size = sizes[len(out) % len(sizes)]
        out.append(stream.feed(text[index:index + size]))
        index += size
    return "".join(out) + stream.close()


@pytest.mark.parametrize("sizes", [[1 << 20], [7, 65536, 3], [4093, 4099, 8191]])
def test_a_long_line_masked_in_pieces_is_masked_exactly_as_whole_even_where_a_secret_straddles_a_piece(sizes) -> None:
    masker = Masker([SECRET, "v" * 9000])
    pieces = ["x" * 4090, SECRET, "y" * 8187, "HF_TOKEN=hf_" + "a" * 40, "z" * 70000, " API_KEY = 'p4ssw0rd!' ",
              "q" * 4095, "ghp_" + "b" * 36 + "c" * 5, WEBHOOK, "v" * 9000, "w" * 12000, f"url http://u:{SECRET}@h",
              "hf_" + "t" * 5000, SECRET + SECRET, "TOKENIZER_NAME=bert-base-uncased"]
    text = "".join(pieces) * 3

    assert _streamed(masker, text, sizes) == masker.mask(text)
    assert SECRET not in masker.mask(text) and "p4ssw0rd!" not in masker.mask(text)


def test_bidi_overrides_and_isolates_are_stripped_for_people() -> None:
    assert strip_control("evil\u202eexe.txt\u2066x\u2069") == "evilexe.txtx"


def test_the_list_of_declared_secret_names_is_no_secret_so_a_later_run_keeps_those_names_readable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run declaring one secret lists it as `TRAINGUARD_SECRET_NAMES=WANDB_API_KEY`. Were that list a
    secret, its value (the bare name) would be masked in every later text of the process: a later run's
    env.json would lose its `WANDB_API_KEY` key to `***`."""
    from trainguard.core import masking

    monkeypatch.setattr(masking, "_registered", set(masking._registered))
    masking.register_environment({"TRAINGUARD_SECRET_NAMES": "WANDB_API_KEY", "WANDB_API_KEY": "planted-secret-4242"})

    later = masking.current().mask('{"WANDB_API_KEY": "planted-secret-4242", "TRAINGUARD_SECRET_NAMES": "WANDB_API_KEY"}')

    assert later == '{"WANDB_API_KEY": "***", "TRAINGUARD_SECRET_NAMES": "WANDB_API_KEY"}'
    variables, changed = redact_environment({"TRAINGUARD_SECRET_NAMES": "WANDB_API_KEY", "WANDB_API_KEY": "x" * 12})
    assert variables == {"TRAINGUARD_SECRET_NAMES": "WANDB_API_KEY", "WANDB_API_KEY": "***"} and changed == ["WANDB_API_KEY"]
