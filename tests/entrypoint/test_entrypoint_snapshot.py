"""Snapshots around the command: the environment with secrets redacted, host facts, GPU state."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from entrypoint_harness import py

from trainguard_entrypoint.redact import redact_argv, redact_environment, redact_text

SECRETS = {
    "MY_API_TOKEN": "s3cr3t",
    "DATABASE_URL": "postgres://u:pw-9x7@h/db",
    "aws_secret_access_key": "AKIAEXAMPLEVALUE",
    "HF_PASSWORD": "hunter22",
    "GCP_CREDENTIALS_JSON": "{\"k\": 1}",
}


def _snapshot_bytes(workspace: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((workspace / "snapshot").rglob("*")) if p.is_file())


def test_secret_values_are_redacted_and_appear_nowhere_in_the_snapshot(run_entrypoint) -> None:
    run = run_entrypoint(py("pass"), env={**SECRETS, "PLAIN_SETTING": "visible"})

    env = run.json("snapshot/env.json")
    assert env["variables"]["MY_API_TOKEN"] == "***"
    assert env["variables"]["DATABASE_URL"] == "postgres://u:***@h/db"
    assert env["variables"]["PLAIN_SETTING"] == "visible"
    assert set(SECRETS) <= set(env["redacted"])
    everything = _snapshot_bytes(run.workspace) + (run.workspace / "crash-report.json").read_bytes()
    for value in ("s3cr3t", "pw-9x7", "AKIAEXAMPLEVALUE", "hunter22"):
        assert value.encode() not in everything


def test_declared_secrets_are_masked_and_the_list_declaring_them_stays_readable(run_entrypoint) -> None:
    declared = {"RUN_NOTE": "plainly-named-secret-41", "DB_URL_PART": "another-secret-77",
                "TRAINGUARD_SECRET_NAMES": "RUN_NOTE,DB_URL_PART"}
    run = run_entrypoint(py("print('TRAINGUARD_SECRET_NAMES=RUN_NOTE,DB_URL_PART')"), env=declared)

    variables = run.json("snapshot/env.json")["variables"]
    assert variables["RUN_NOTE"] == variables["DB_URL_PART"] == "***"
    assert variables["TRAINGUARD_SECRET_NAMES"] == "RUN_NOTE,DB_URL_PART"
    assert "TRAINGUARD_SECRET_NAMES" not in run.json("snapshot/env.json")["redacted"]
    report = (run.workspace / "crash-report.json").read_text()
    assert "plainly-named-secret-41" not in report and "another-secret-77" not in report
    assert "RUN_NOTE,DB_URL_PART" in report  # the log line naming them, in the report's tail, is not masked


def test_the_command_itself_still_gets_the_real_secret(run_entrypoint) -> None:
    run = run_entrypoint(py("import os; print(os.environ['MY_API_TOKEN'])"), env=SECRETS)

    assert run.stdout.startswith(b"s3cr3t\n")


def test_host_facts_record_core_dump_settings(run_entrypoint) -> None:
    host = run_entrypoint(py("pass")).json("snapshot/host.json")

    assert host["python_version"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert host["core_pattern"] == Path("/proc/sys/kernel/core_pattern").read_text().strip()
    assert set(host["rlimit_core"]) == {"soft", "hard"}
    assert host["uid"] == os.getuid()
    assert "kept" in host["core_dumps"]


def test_without_nvidia_smi_the_gpu_snapshot_records_each_capture_as_absent_with_why(run_entrypoint) -> None:
    run = run_entrypoint(py("pass"))

    for phase in ("gpu-before", "gpu-after"):
        index = run.json(f"snapshot/{phase}/index.json")
        reasons = {a["name"]: a["reason"] for a in index["absent"]}
        assert index["captured"] == []
        assert reasons == {
            "nvidia-smi-q.txt": "nvidia-smi not found on PATH",
            "nvidia-smi-topo-m.txt": "nvidia-smi not found on PATH",
            "driver-version.txt": "no such file: /proc/driver/nvidia/version",
        }


def _plant_nvidia_smi(folder: Path, body: str) -> str:
    """A stand-in ``nvidia-smi``: this machine has no GPU, the one thing a test cannot provide."""
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return os.pathsep.join([str(folder), str(Path(sys.executable).parent), "/usr/bin", "/bin"])


def test_a_working_nvidia_smi_is_captured_before_and_after(run_entrypoint, tmp_path: Path) -> None:
    path = _plant_nvidia_smi(tmp_path / "bin", 'echo "fake-gpu output for: $*"')
    run = run_entrypoint(py("pass"), path=path)

    for phase in ("gpu-before", "gpu-after"):
        folder = run.workspace / "snapshot" / phase
        assert (folder / "nvidia-smi-q.txt").read_text() == "fake-gpu output for: -q\n"
        assert (folder / "nvidia-smi-topo-m.txt").read_text() == "fake-gpu output for: topo -m\n"
        index = run.json(f"snapshot/{phase}/index.json")
        assert {c["name"] for c in index["captured"]} == {"nvidia-smi-q.txt", "nvidia-smi-topo-m.txt"}


def test_a_failing_nvidia_smi_is_absent_with_its_exit_code_and_stderr(run_entrypoint, tmp_path: Path) -> None:
    path = _plant_nvidia_smi(tmp_path / "bin", 'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2; exit 9')
    run = run_entrypoint(py("pass"), path=path)

    reasons = {a["name"]: a["reason"] for a in run.json("snapshot/gpu-before/index.json")["absent"]}
    assert reasons["nvidia-smi-q.txt"] == (
        "nvidia-smi -q exited with code 9: NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."
    )


def test_a_hung_nvidia_smi_times_out_and_the_command_still_runs(run_entrypoint, tmp_path: Path) -> None:
    path = _plant_nvidia_smi(tmp_path / "bin", "exec sleep 30")
    run = run_entrypoint(py("print('trained')"), "--gpu-timeout-seconds", "0.3", path=path)

    assert run.returncode == 0
    assert run.stdout.startswith(b"trained\n")
    reasons = {a["name"]: a["reason"] for a in run.json("snapshot/gpu-before/index.json")["absent"]}
    assert reasons["nvidia-smi-q.txt"] == "nvidia-smi -q timed out after 0.3s"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgres://u:pw@h/db", "postgres://u:***@h/db"),
        ("https://user:p%40ss@example.com:8443/x", "https://user:***@example.com:8443/x"),
        ("redis://:onlypass@cache:6379/0", "redis://:***@cache:6379/0"),
        ("a=s3://bucket/key b=mysql+pymysql://root:rootpw@db/x", "a=s3://bucket/key b=mysql+pymysql://root:***@db/x"),
        ("http://example.com:8080/path", "http://example.com:8080/path"),
        ("no url here: a:b@c", "no url here: a:b@c"),
    ],
)
def test_url_credentials_are_redacted_in_any_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize("name", ["MY_API_TOKEN", "api_key", "Db_Password", "AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS"])
def test_variables_with_secret_looking_names_are_redacted_whatever_the_case(name: str) -> None:
    redacted, names = redact_environment({name: "value", "HOME": "/root"})

    assert redacted == {name: "***", "HOME": "/root"}
    assert names == [name]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train.py", "--hf-token", "abc", "--lr", "0.1"], ["train.py", "--hf-token", "***", "--lr", "0.1"]),
        (["train.py", "--api_key=abc", "--epochs=3"], ["train.py", "--api_key=***", "--epochs=3"]),
        (["train.py", "--db", "postgres://u:pw@h/db"], ["train.py", "--db", "postgres://u:***@h/db"]),
    ],
)
def test_secrets_passed_as_arguments_are_redacted_in_reports(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv) == expected
