"""Run specs: valid ones become policies, bad ones give one line naming the field and the fix."""

from __future__ import annotations

import pytest

from trainguard.core.spec import SpecError, load_spec, parse_spec
from trainguard.core.taxonomy import Category

GOOD = {"name": "tiny-run", "command": "python train.py --steps 10", "retry": {"max_attempts": 4}}


def test_a_string_command_is_split_like_a_shell_would():
    assert parse_spec(GOOD).command == ["python", "train.py", "--steps", "10"]


def test_retry_settings_become_the_core_policy_with_overrides():
    spec = parse_spec({**GOOD, "retry": {"overrides": {"cuda_oom": {"retryable": True}}}})
    policy = spec.retry.to_policy()
    assert policy.overrides[Category.CUDA_OOM].retryable is True and policy.host_oom_memory_factor == 1.0
    oom = {"host_oom_memory_factor": 2, "overrides": {"host_oom": {"retryable": True}}}
    assert parse_spec({**GOOD, "retry": oom}).retry.to_policy().host_oom_memory_factor == 2.0


@pytest.mark.parametrize(
    ("data", "field", "hint"),
    [
        ({**GOOD, "retry": {"max_attempts": -1}}, "retry.max_attempts", "greater than or equal to 1"),
        ({"name": "tiny-run"}, "command", "required"),
        ({**GOOD, "command": []}, "command", "at least 1"),
        ({**GOOD, "retry": {"overrides": {"cosmic_rays": {"retryable": True}}}}, "retry.overrides.cosmic_rays", "cuda_oom"),
        ({**GOOD, "name": "Has Spaces"}, "name", "lowercase letters"),
        ({**GOOD, "comand": ["x"]}, "comand", "unknown field"),
        ({**GOOD, "retry": {"host_oom_memory_factor": 8}}, "retry.host_oom_memory_factor", "less than or equal to 4"),
        ({**GOOD, "retry": {"host_oom_memory_factor": 2}}, "retry: host_oom_memory_factor",
         "add overrides: {host_oom: {retryable: true}}"),
    ],
)
def test_a_bad_spec_names_the_field_and_the_fix_in_one_line(data, field, hint):
    with pytest.raises(SpecError) as caught:
        parse_spec(data, "run.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"run.yaml: {field}")
    assert hint in message


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ({**GOOD, "stall_secs": 60}, "run.yaml: stall_secs: unknown field; did you mean stall_seconds?"),
        ({**GOOD, "retry": {"max_attempt": 3}}, "run.yaml: retry.max_attempt: unknown field; did you mean max_attempts?"),
        ({**GOOD, "retry": {"overrides": {"cuda_oom": {"retryabl": True}}}},
         "run.yaml: retry.overrides.cuda_oom.retryabl: unknown field; did you mean retryable?"),
        ({"name": "tiny-run", "comand": ["x"]},
         "run.yaml: command: this field is required; 'comand' is not a field: did you mean command?"),
        ({**GOOD, "colour": "red"},
         "run.yaml: colour: unknown field; check its spelling against the documented spec fields"),
    ],
)
def test_a_misspelt_field_gets_the_field_it_misspells_in_one_line(data, line):
    with pytest.raises(SpecError) as caught:
        parse_spec(data, "run.yaml")
    assert str(caught.value) == line


@pytest.mark.parametrize(
    ("command", "index"),
    [(["python", "train.py", "--password", "hunter2hunter2"], 3),
     (["python", "train.py", "--token", "hf_" + "a" * 34], 3),
     (["python", "train.py", "--api-key=abcdef123456"], 2),
     (["python", "train.py", "--db", "postgres://me:pa55word@db/x"], 3),
     (["env", "WANDB_API_KEY=abcdef123456", "python", "train.py"], 1)],
)
def test_a_secret_on_the_command_line_is_refused_saying_to_use_secret_env(command, index):
    with pytest.raises(SpecError) as caught:
        parse_spec({**GOOD, "command": command}, "run.yaml")
    message = str(caught.value)
    assert message.startswith(f"run.yaml: command: argument {index} looks like a secret") and "\n" not in message
    assert "secret_env" in message
    assert not any(secret in message for secret in ("hunter2", "hf_a", "abcdef", "pa55word"))  # never echoed


def test_ordinary_arguments_and_variables_named_like_secrets_by_prefix_are_accepted():
    command = ["python", "train.py", "--tokenizer", "bert-base-uncased", "--max-tokens", "4096", "--sort-key", "loss"]
    env = {"TOKENIZER_NAME": "bert-base-uncased", "KEYBOARD_LAYOUT": "us-intl"}
    spec = parse_spec({**GOOD, "command": command, "env": env})
    assert spec.command == command and spec.env == env


def test_a_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ncommand: [python\n")
    with pytest.raises(SpecError, match=r"bad.yaml: line \d+"):
        load_spec(path)


def test_a_missing_spec_file_says_what_to_pass(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")


@pytest.mark.parametrize("command, env, named", [
    (["torchrun", "--max-restarts", "3", "train.py"], {}, "command: --max-restarts 3"),
    (["python", "-m", "torch.distributed.run", "--max_restarts=1", "train.py"], {}, "command: --max-restarts 1"),
    (["torchrun", "train.py"], {"PET_MAX_RESTARTS": "2"}, "env: PET_MAX_RESTARTS 2"),
])
def test_restarts_inside_the_job_are_refused_in_one_line_as_a_backoff_limit_would_be(command, env, named) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec({"name": "ddp", "command": command, "env": env})
    message = str(caught.value)
    assert message.startswith(f"spec: {named}: trainguard alone retries") and "\n" not in message


def test_a_scripts_own_max_restarts_argument_is_the_scripts_and_torchruns_nproc_is_taken() -> None:
    spec = parse_spec({"name": "ddp", "command": ["torchrun", "--nproc-per-node", "2", "train.py", "--max-restarts", "9"]})
    assert (spec.nodes, spec.nprocs, spec.total_gpus) == (1, 2, 0)
    assert parse_spec({"name": "ddp", "command": ["torchrun", "t.py"], "gpus": 8, "nodes": 4}).nprocs == 8
    assert parse_spec({"name": "ddp", "command": ["torchrun", "t.py"], "gpus": 8, "nodes": 4}).total_gpus == 32


def test_torchruns_own_node_count_must_agree_with_the_specs() -> None:
    with pytest.raises(SpecError, match=r"^spec: command: --nnodes 2 disagrees with nodes: 1; .* or set nodes: 2$"):
        parse_spec({"name": "ddp", "command": ["torchrun", "--nnodes", "2", "t.py"]})
    assert parse_spec({"name": "ddp", "command": ["torchrun", "--nnodes=2", "t.py"], "nodes": 2}).nodes == 2


@pytest.mark.parametrize("value", [0, 0.5, 3601, -5])
def test_a_notice_grace_out_of_range_is_one_line_naming_the_field_and_the_range(value: float) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec({"name": "n", "command": ["python", "t.py"], "notice_grace_seconds": value})
    message = str(caught.value)
    assert "\n" not in message and "notice_grace_seconds" in message and "from 1 to 3600" in message


def test_a_notice_grace_reaches_the_launch() -> None:
    assert parse_spec({"name": "n", "command": ["t"], "notice_grace_seconds": 75}).notice_grace_seconds == 75
