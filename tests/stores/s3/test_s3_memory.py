"""A 1 GiB item goes up in bounded memory: the uploading process's peak RSS stays under 128 MiB.

The upload runs in a child process (so the figure is its own) against a moto server in its own
process (moto joins the parts in memory; that is the server's cost, not ours). The item is a sparse
file: reading it costs no disk, and the store cannot tell. The exact figures are the benchmark's
(benchmarks/evidence_upload.py); this bound is generous on purpose.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from s3fixtures import CREDENTIALS
from waiting import wait_for

GIB = 1024**3
UPLOAD = """
import json, sys
from pathlib import Path
from trainguard.core.stores.s3.bucket import S3Bucket, S3Settings
from trainguard.core.stores.s3.store import S3Store, UploadPolicy
from trainguard.core.stores.s3.spool import Spool

def peak_rss_mib():
    # VmHWM is this program's own peak. getrusage's ru_maxrss is not: across the exec it keeps the
    # peak of the process it was started from (here pytest itself, with Prefect loaded).
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmHWM in /proc/self/status")

endpoint, source, spool = sys.argv[1:4]
policy = UploadPolicy(budget_seconds=None)
store = S3Store(S3Bucket(S3Settings(bucket="big", region="us-east-1", endpoint_url=endpoint, read_timeout_seconds=300)),
                "tg", Spool(Path(spool), policy.part_bytes), policy)
item = store.put_file("runs/big/attempt-1/coredumps/core.1", Path(source))
print(json.dumps({"pending": store.pending(), "error": store.last_error, "checksum": item.checksum_sha256,
                  "size": item.size_bytes, "peak_rss_mib": peak_rss_mib()}))
"""


@pytest.fixture
def moto_process():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # moto keeps objects in memory up to this size instead of in temporary files: the server's
    # disk traffic would otherwise dominate the test's time on a busy machine
    env = {**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(2 * GIB)}
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
        except OSError:
            return False
        return True

    try:
        wait_for(answers, timeout=60, what="moto_server to answer")
        yield url
    finally:
        server.terminate()
        server.wait(30)


@pytest.mark.timeout(600)
def test_a_1_gib_item_uploads_with_peak_rss_under_128_mib(moto_process, tmp_path) -> None:
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    urllib.request.urlopen(urllib.request.Request(f"{moto_process}/big", method="PUT")).close()
    source = tmp_path / "core.1"
    with source.open("wb") as out:
        out.truncate(GIB)  # sparse: zeros that cost no disk

    done = subprocess.run([sys.executable, "-c", UPLOAD, moto_process, str(source), str(tmp_path / "spool")],
                          capture_output=True, text=True, env=env, timeout=540)

    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["pending"] == [] and result["error"] == "" and result["size"] == GIB
    assert result["checksum"].endswith("-128")  # 128 parts of 8 MiB, each checked by S3
    assert result["peak_rss_mib"] < 128, result
