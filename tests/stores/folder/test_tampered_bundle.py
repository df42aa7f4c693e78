"""`trainguard evidence get | show` over an evidence folder someone tampered with: links, FIFOs, hard links.

The job runs as the same user as the flow, so it can write the evidence folder too. Only regular
files of the bundle's own are read: a link's target is never streamed out (not even before its hash
check fails), and a FIFO never holds a command up. Every command runs as a user runs it, in a
subprocess, with a time limit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.core.evidence.manifest import Manifest, ManifestItem, write_manifest
from trainguard.core.stores.folder import LocalEvidenceStore

ROOT = Path(__file__).resolve().parents[3]
HOST = b"HOST-ONLY-BYTES-77aa\n"
LOG = b"step 1 loss 0.5\n" * 1000


def _evidence(*args: str, root: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "trainguard.cli", "evidence", *args, "--root", str(root)],
                          capture_output=True, env=env, timeout=60, check=False)


@pytest.fixture
def bundle(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(evidence root, the stored log's path, a host file) for a bundle holding one log."""
    store = LocalEvidenceStore(tmp_path / "evidence")
    items = []
    for name, data in (("logs/train.log", LOG), ("crash-tail.txt", b"")):
        stored = store.put_bytes(f"runs/r1/attempt-1/{name}", data)
        items.append(ManifestItem(name, stored.key, stored.sha256, stored.size_bytes, "entrypoint",
                                  "2026-01-01T00:00:00+00:00"))
    write_manifest(store, Manifest("r1", 1, "2026-01-01T00:00:00+00:00", tuple(items), ()))
    host = tmp_path / "host" / "train.log"
    host.parent.mkdir()
    host.write_bytes(HOST * 100)
    return store.root, store.root / "runs" / "r1" / "attempt-1" / "logs" / "train.log", host


def _replace_with_link(path: Path, host: Path) -> None:
    path.unlink()
    path.symlink_to(host)


def _replace_folder_with_link(path: Path, host: Path) -> None:
    path.unlink()
    path.parent.rmdir()
    path.parent.symlink_to(host.parent)


def _replace_with_hard_link(path: Path, host: Path) -> None:
    path.unlink()
    os.link(host, path)


def _rewrite_in_place(path: Path, host: Path) -> None:
    path.write_bytes(host.read_bytes())  # a regular file of the bundle's own, with other bytes


@pytest.mark.parametrize("tamper", [_replace_with_link, _replace_folder_with_link, _replace_with_hard_link,
                                    _rewrite_in_place])
def test_get_to_stdout_never_streams_what_a_tampered_item_points_at(bundle, tamper) -> None:
    root, log, host = bundle
    tamper(log, host)

    done = _evidence("get", "r1", "1", "logs/train.log", "-o", "-", root=root)

    assert done.returncode == 1, done.stderr
    assert HOST not in done.stdout and done.stdout == b""
    err = done.stderr.decode()
    assert len(err.strip().splitlines()) == 1 and "logs/train.log" in err and "Traceback" not in err, err


def test_show_does_not_wait_on_a_fifo_in_place_of_an_item_or_of_the_manifest(bundle) -> None:
    root, log, _ = bundle
    tail = log.parent.parent / "crash-tail.txt"  # empty, as a FIFO's size reads: it passes the size check
    tail.unlink()
    os.mkfifo(tail)  # nobody will ever write it

    shown = _evidence("show", "r1", root=root)

    assert shown.returncode == 1
    assert "FIFO" in shown.stdout.decode() + shown.stderr.decode()
    manifest = root / "runs" / "r1" / "attempt-1" / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)

    shown = _evidence("show", "r1", root=root)

    assert shown.returncode == 1 and "Traceback" not in shown.stderr.decode()
    assert "FIFO" in shown.stdout.decode() + shown.stderr.decode()
