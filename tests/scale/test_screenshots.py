"""The README's pictures can be made again: docs/screenshots.py against this folder's Prefect server.

Real parts: the session's `prefect server start` (on PostgreSQL, with its UI), the demo run through
it, and headless Chromium from Debian's `chromium` package (`./dev test` installs it when missing).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path

from services.prefect_server import quiet_env

ROOT = Path(__file__).resolve().parents[2]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_the_screenshot_script_photographs_a_retried_run_and_its_whole_report_on_the_test_server(pg_server, tmp_path):
    assert shutil.which("chromium"), "chromium is missing: ./dev test installs Debian's package"
    base = pg_server.api_url.removesuffix("/api")
    with urllib.request.urlopen(f"{base}/ui-settings", timeout=30) as answer:
        assert json.loads(answer.read())["api_url"].rstrip("/") == pg_server.api_url, "the UI must call this server"
    done = subprocess.run([sys.executable, "docs/screenshots.py", "--server", base, "--out", str(tmp_path)], cwd=ROOT,
                          env={**quiet_env(pg_server.api_url), "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    run_page = (tmp_path / "ui-retried-run.png").read_bytes()
    report = (tmp_path / "ui-run-report.png").read_bytes()
    assert _png_size(run_page) == (1400, 900)
    assert _png_size(report) == (2000, 1000), "wide enough for the timeline's last column"
    assert len(run_page) > 50_000 and len(report) > 50_000, "a page with content, not an error page"
