"""The README's "your own training script in five minutes" runs as written: examples/quickstart.

The spec and the script are copied unchanged into a folder laid out as the checkout is (the spec's
`workdir` is relative to where trainguard runs), and run with the command the README gives.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from test_cli import ROOT, trainguard


def test_the_quickstart_fails_once_on_a_transient_error_and_resumes_from_its_step_20_checkpoint(
        prefect_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(ROOT / "examples" / "quickstart", tmp_path / "examples" / "quickstart")
    # the data root the checkout's ./dev would give it, here the copy's (also the default without it)
    monkeypatch.setenv("TRAINGUARD_HOME", str(tmp_path / "trainguard-data"))

    result = trainguard("run", "examples/quickstart/spec.yaml", cwd=tmp_path, api_url=prefect_server)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "succeeded on attempt 2" in out
    assert "transient_io" in out and "ConnectionResetError" in out
    assert "step-000020.json" in out  # attempt 2 resumed from the checkpoint attempt 1 left
    run_id = re.search(r"evidence show (quickstart-[0-9a-f]+)", out)
    assert run_id, out[-2000:]
    for attempt in (1, 2):
        assert (tmp_path / "trainguard-data" / "evidence" / "runs" / run_id.group(1) / f"attempt-{attempt}"
                / "verdict.json").is_file()
    shown = trainguard("evidence", "show", run_id.group(1), cwd=tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "logs/train-" in shown.stdout and "checkpoint/step-000020.json" in shown.stdout
