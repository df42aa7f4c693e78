"""One data root: TRAINGUARD_HOME, else ./trainguard-data, for the default folders of every command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from blocks.factories import evidence_folder, local_backend
from trainguard.core.home import data_path, data_root

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_folders_lie_under_trainguard_home_and_other_paths_stay_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINGUARD_HOME", str(tmp_path / "home"))

    assert data_root() == tmp_path / "home"
    assert data_path("trainguard-data/work") == tmp_path / "home" / "work"
    assert data_path("elsewhere/work") == tmp_path / "elsewhere" / "work"
    assert data_path(tmp_path / "abs") == tmp_path / "abs"
    assert local_backend("trainguard-data/work").work_root == tmp_path / "home" / "work"  # type: ignore[attr-defined]
    assert evidence_folder("trainguard-data/evidence").describe().endswith(str(tmp_path / "home" / "evidence"))


def test_without_trainguard_home_the_data_root_is_trainguard_data_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAINGUARD_HOME", raising=False)

    assert data_path("trainguard-data/evidence") == tmp_path / "trainguard-data" / "evidence"


def test_every_command_reads_the_data_root_from_any_folder(tmp_path):
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAINGUARD_HOME": str(tmp_path / "home"), "COLUMNS": "300"}
    for command in (["runs"], ["evidence", "list"], ["fleet"]):
        result = subprocess.run([sys.executable, "-m", "trainguard.cli", *command], cwd=elsewhere, env=env,
                                capture_output=True, text=True, timeout=120)
        said = " ".join((result.stdout + result.stderr).split())
        assert str(tmp_path / "home" / "evidence") in said, (command, said)
        assert not (elsewhere / "trainguard-data").exists()
